/* fwd_block_tmpl.h - one instance of the forward's inner loop (fwd_block.h).
 * No include guard: fwd_block.c includes it once per ISA after defining
 *   KT_ISA    the instance's name (a bare word): its functions are
 *             fwd_<KT_ISA>_*, its table fattn_fwd_kernel_<KT_ISA>
 *   KT_ATTR   the instance's function attributes (target ISA)
 *   KT_W      floats per vector
 *   KT_NV     vectors per panel row: NR = KT_NV * KT_W queries
 *   KT_MR     rows of the register tile: keys in S^T = K Q^T, value columns
 *             in O^T += V^T P^T (KT_MR x KT_NV accumulators)
 *   KT_BN     keys per block
 * and optionally KT_MAX(a, b) (a max instruction of the ISA) and
 * KT_TRANSPOSE8; it undefines all but KT_TRANSPOSE8 at its end.
 * The arithmetic is written once, as plain vector expressions; `a * b + c`
 * is contracted to one FMA where the target has it (GNU C's default
 * -ffp-contract=fast, Clang's =on), the same way in every instance. */

#define KT_CAT3_(a, b, c) a##b##c
#define KT_CAT3(a, b, c) KT_CAT3_(a, b, c)
#define KT_STR_(x) #x
#define KT_STR(x) KT_STR_(x)
#define KT(name) KT_CAT3(fwd_, KT_ISA, _##name)
/* vectors of KT_W float / int32_t / uint32_t (GCC extensions) */
typedef float KT(vt) __attribute__((vector_size(KT_W * 4)));
typedef int32_t KT(vi) __attribute__((vector_size(KT_W * 4)));
typedef uint32_t KT(vu) __attribute__((vector_size(KT_W * 4)));
#define VT KT(vt)
#define VI KT(vi)
#define VU KT(vu)
#define KT_NR (KT_NV * KT_W)
#define KT_INLINE KT_ATTR static inline __attribute__((always_inline))

/* x - 0 is x for every x (x + 0 is not, for -0), so this is a bare broadcast */
KT_INLINE VT KT(splat)(float x) { return x - (VT){0}; }
KT_INLINE VT KT(load)(const float *p) { VT v; memcpy(&v, p, sizeof v); return v; }
/* Vectors go to helpers by address: GCC notes an ABI change for 64-byte
 * vector parameters of AVX2 functions (the avx2w16 instance) even when they
 * are inlined.  The store is an assignment through an unaligned vector type,
 * not a memcpy from *v: with the memcpy GCC kept pv_tile's accumulators in a
 * stack slot (stored there after the loop, then copied to C in 16-byte
 * pieces). */
typedef VT KT(vtu) __attribute__((aligned(4), may_alias));
KT_INLINE void KT(store)(float *p, const VT *v) { *(KT(vtu) *)p = *v; }
/* mask ? a : b, mask lanes all ones or all zeros */
#define KT_SELECT(mask, a, b) ((VT)(((mask) & (VI)(a)) | (~(mask) & (VI)(b))))
/* a > b ? a : b: b where either is NaN, as x86's maxps (an instance may
 * define KT_MAX as that instruction) */
#ifndef KT_MAX
#define KT_MAX(a, b) KT_SELECT((a) > (b), (a), (b))
#endif

/* exp(x) for x <= 88 (the softmax only asks for x <= 0): Cephes' range
 * reduction x = n ln2 + r, |r| <= ln2/2, and degree-6 polynomial (<= 2 ulp,
 * tests/test_cpu_kernels.c measures it); x below ln 2^-126 (and -inf) gives
 * exactly 0, NaN gives NaN.  n + 127 is read from the low bits of
 * x log2e + (1.5 * 2^23 + 127) (round to nearest): shifted left by 23 they are
 * the exponent of 2^n, and no float -> int conversion ever sees a NaN.  The
 * clamp keeps 2^n normal below ln 2^-126, where the result is masked to 0. */
KT_INLINE VT KT(exp)(const VT *px) {
    const VT x = *px;
    const VT lo = KT(splat)(-87.3365479f);
    const VT magic = KT(splat)(12583039.0f); /* 1.5 * 2^23 + 127 */
    const VI under = x < lo; /* false for NaN */
    const VT xc = KT_MAX(lo, x); /* NaN stays NaN */
    const VT kf = xc * 1.44269504088896341f + magic;
    const VT n = kf - magic;
    VT r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const VT r2 = r * r;
    VT y = r * 1.9875691500E-4f + 1.3981999507E-3f;
    y = y * r + 8.3334519073E-3f;
    y = y * r + 4.1665795894E-2f;
    y = y * r + 1.6666665459E-1f;
    y = y * r + 5.0000001201E-1f;
    y = y * r2 + r;
    y = y + 1.0f;
    y = y * (VT)((VU)kf << 23);
    return (VT)(~under & (VI)y);
}

/* C[r][0..NR) = sum_p A[r * lda + p] * B[p][0..NR), r < mr: the S^T tile of
 * keys r (rows of K) against one Q^T panel.  On the way out, key r is hidden
 * (-inf) from the lanes c < thr + r (causal), and the tile's column max is
 * folded into bmax[0..NR) (NaN scores are skipped there; they reach O and LSE
 * through exp). */
KT_INLINE void KT(qk_tile)(const int mr, int k, const float *A, int64_t lda, const float *B,
                           float *C, int64_t thr, float *bmax) {
    VT acc[KT_MR][KT_NV];
    const float *a[KT_MR];
    for (int r = 0; r < mr; r++) {
        a[r] = A + r * lda;
        for (int v = 0; v < KT_NV; v++) acc[r][v] = (VT){0};
    }
    for (int p = 0; p < k; p++) {
        VT b[KT_NV];
        for (int v = 0; v < KT_NV; v++) b[v] = KT(load)(B + (int64_t)p * KT_NR + v * KT_W);
        for (int r = 0; r < mr; r++) {
            const VT x = KT(splat)(a[r][p]);
            for (int v = 0; v < KT_NV; v++) acc[r][v] = x * b[v] + acc[r][v];
        }
    }
    /* Every tile is stored and folded into the max as is; a tile with a
     * hidden key (only on a causal diagonal) drops that max and masks its
     * rows in S^T afterwards.  Masking acc itself, or reading acc on two paths
     * after the loop, made GCC keep acc in a stack slot for every tile. */
    const int masked = thr + mr - 1 > 0;
    for (int v = 0; v < KT_NV; v++) {
        VT mx = KT(load)(bmax + v * KT_W);
        for (int r = 0; r < mr; r++) {
            KT(store)(C + r * KT_NR + v * KT_W, &acc[r][v]);
            mx = KT_MAX(acc[r][v], mx);
        }
        if (!masked) KT(store)(bmax + v * KT_W, &mx);
    }
    if (!masked) return;
    const VT ninf = KT(splat)(-INFINITY);
    for (int v = 0; v < KT_NV; v++) {
        VT mx = KT(load)(bmax + v * KT_W);
        VI lane;
        for (int c = 0; c < KT_W; c++) lane[c] = v * KT_W + c;
        for (int r = 0; r < mr; r++) {
            VT x = KT(load)(C + r * KT_NR + v * KT_W);
            if (thr + r > 0) {
                const int32_t t = thr + r > KT_NR ? KT_NR : (int32_t)(thr + r);
                x = KT_SELECT(lane < t, ninf, x);
                KT(store)(C + r * KT_NR + v * KT_W, &x);
            }
            mx = KT_MAX(x, mx);
        }
        KT(store)(bmax + v * KT_W, &mx);
    }
}

/* C[r][0..NR) = (alpha ? C[r] * alpha : 0) + sum_j A[j * lda + r] * B[j][0..NR),
 * r < mr: the O^T tile of value columns r (A = V + t0) against one P^T panel,
 * with the online softmax's rescale folded into the load of C. */
KT_INLINE void KT(pv_tile)(const int mr, int k, const float *A, int64_t lda, const float *B,
                           float *C, const float *alpha) {
    VT acc[KT_MR][KT_NV];
    if (alpha) {
        VT al[KT_NV];
        for (int v = 0; v < KT_NV; v++) al[v] = KT(load)(alpha + v * KT_W);
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < KT_NV; v++) acc[r][v] = KT(load)(C + r * KT_NR + v * KT_W) * al[v];
    } else {
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < KT_NV; v++) acc[r][v] = (VT){0};
    }
    for (int j = 0; j < k; j++) {
        VT b[KT_NV];
        const float *a = A + (int64_t)j * lda;
        for (int v = 0; v < KT_NV; v++) b[v] = KT(load)(B + (int64_t)j * KT_NR + v * KT_W);
        for (int r = 0; r < mr; r++) {
            const VT x = KT(splat)(a[r]);
            for (int v = 0; v < KT_NV; v++) acc[r][v] = x * b[v] + acc[r][v];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < KT_NV; v++) KT(store)(C + r * KT_NR + v * KT_W, &acc[r][v]);
}

/* One function per tile height, so that every accumulator lives in a
 * register; the dispatch is by the remaining rows (always KT_MR but at an
 * edge).  pv_tile is inlined twice, with alpha and with a constant NULL: one
 * copy with both initialisations of the accumulators made GCC pass them
 * through the stack. */
#define KT_TILE_FN(n)                                                                          \
    KT_ATTR static void KT(qk_##n)(int k, const float *A, int64_t lda, const float *B,         \
                                   float *C, int64_t thr, float *bmax) {                       \
        KT(qk_tile)(n, k, A, lda, B, C, thr, bmax);                                            \
    }                                                                                          \
    KT_ATTR static void KT(pv_##n)(int k, const float *A, int64_t lda, const float *B,         \
                                   float *C, const float *alpha) {                             \
        if (alpha) KT(pv_tile)(n, k, A, lda, B, C, alpha);                                     \
        else KT(pv_tile)(n, k, A, lda, B, C, NULL);                                            \
    }
KT_TILE_FN(1)
KT_TILE_FN(2)
KT_TILE_FN(3)
KT_TILE_FN(4)
#if KT_MR >= 5
KT_TILE_FN(5)
KT_TILE_FN(6)
#endif
#if KT_MR >= 7
KT_TILE_FN(7)
KT_TILE_FN(8)
#endif
#if KT_MR > 8
#error "KT_MR > 8: add tile functions"
#endif
#undef KT_TILE_FN

KT_ATTR static void KT(qk)(int mr, int k, const float *A, int64_t lda, const float *B, float *C,
                           int64_t thr, float *bmax) {
    switch (mr) {
    case 1: KT(qk_1)(k, A, lda, B, C, thr, bmax); break;
    case 2: KT(qk_2)(k, A, lda, B, C, thr, bmax); break;
    case 3: KT(qk_3)(k, A, lda, B, C, thr, bmax); break;
    case 4: KT(qk_4)(k, A, lda, B, C, thr, bmax); break;
#if KT_MR >= 5
    case 5: KT(qk_5)(k, A, lda, B, C, thr, bmax); break;
    case 6: KT(qk_6)(k, A, lda, B, C, thr, bmax); break;
#endif
#if KT_MR >= 7
    case 7: KT(qk_7)(k, A, lda, B, C, thr, bmax); break;
    case 8: KT(qk_8)(k, A, lda, B, C, thr, bmax); break;
#endif
    default: break;
    }
}

KT_ATTR static void KT(pv)(int mr, int k, const float *A, int64_t lda, const float *B, float *C,
                           const float *alpha) {
    switch (mr) {
    case 1: KT(pv_1)(k, A, lda, B, C, alpha); break;
    case 2: KT(pv_2)(k, A, lda, B, C, alpha); break;
    case 3: KT(pv_3)(k, A, lda, B, C, alpha); break;
    case 4: KT(pv_4)(k, A, lda, B, C, alpha); break;
#if KT_MR >= 5
    case 5: KT(pv_5)(k, A, lda, B, C, alpha); break;
    case 6: KT(pv_6)(k, A, lda, B, C, alpha); break;
#endif
#if KT_MR >= 7
    case 7: KT(pv_7)(k, A, lda, B, C, alpha); break;
    case 8: KT(pv_8)(k, A, lda, B, C, alpha); break;
#endif
    default: break;
    }
}

/* C[r][c] += sum_{j0 <= j < k} A[j * lda + r] * B[j][c] for the lanes c that
 * see key j (c >= thr + j), r < mr: the keys of a causal diagonal that some
 * lanes do not see, after KT(pv) has taken the keys below j0.  A hidden lane
 * keeps its accumulator instead of adding 0 x v, so that a NaN or Inf in a
 * value row that a query does not see never reaches its O (issue 43); the
 * other lanes compute the expression of pv_tile, in the same key order, and
 * C holds their exact f32 partial sums in between, so their bits are those
 * of one KT(pv) over every key.  run() takes this path only for blocks with
 * a value row that is not finite (for finite rows adding 0 x v is exact): a
 * second loop inside pv_tile cost the common path 15-20% at short causal
 * rows. */
KT_ATTR static void KT(pv_masked)(const int mr, int j0, int k, const float *A, int64_t lda, const float *B,
                                  float *C, int64_t thr, int64_t left) {
    for (int r = 0; r < mr; r++) {
        VT acc[KT_NV];
        for (int v = 0; v < KT_NV; v++) acc[v] = KT(load)(C + r * KT_NR + v * KT_W);
        for (int j = j0; j < k; j++) {
            const VT x = KT(splat)(A[(int64_t)j * lda + r]);
            const int32_t t = thr + j > KT_NR ? KT_NR : (int32_t)(thr + j);
            /* a sliding window also hides key j from the lanes c > thr + j + left */
            const int64_t hi = left < 0 ? KT_NR : thr + j + left;
            const int32_t u = hi >= KT_NR ? KT_NR : hi < -1 ? -1 : (int32_t)hi;
            for (int v = 0; v < KT_NV; v++) {
                VI lane;
                for (int c = 0; c < KT_W; c++) lane[c] = v * KT_W + c;
                const VT bv = KT(load)(B + (int64_t)j * KT_NR + v * KT_W);
                acc[v] = KT_SELECT((lane < t) | (lane > u), acc[v], x * bv + acc[v]);
            }
        }
        for (int v = 0; v < KT_NV; v++) KT(store)(C + r * KT_NR + v * KT_W, &acc[v]);
    }
}

/* Online softmax of one panel over jn keys (DESIGN.md section 1), vectorised
 * over its NR queries: s = S^T [jn][NR] (masked) in, P^T out; m, l [NR];
 * alpha [NR] holds the block's max on entry (qk_tile) and the rescale factor
 * on return.  A -inf running max subtracts 0 instead (FlashAttention's
 * guard): -inf scores give 0 and NaN scores stay NaN, so a NaN reaches O and
 * LSE. */
KT_INLINE void KT(softmax)(float *s, int jn, float *m, float *l, float *alpha) {
    const VT ninf = KT(splat)(-INFINITY);
    for (int v = 0; v < KT_NV; v++) {
        const VT mx = KT(load)(alpha + v * KT_W);
        const VT m_old = KT(load)(m + v * KT_W);
        const VT m_new = KT_MAX(mx, m_old);
        const VT m_use = KT_SELECT(m_new == ninf, (VT){0}, m_new);
        VT sum = (VT){0};
        for (int j = 0; j < jn; j++) {
            float *sp = s + (int64_t)j * KT_NR + v * KT_W;
            const VT x = KT(load)(sp) - m_use;
            const VT p = KT(exp)(&x);
            KT(store)(sp, &p);
            sum = sum + p;
        }
        const VT dm = m_old - m_use;
        const VT al = KT(exp)(&dm);
        const VT l_new = KT(load)(l + v * KT_W) * al + sum;
        KT(store)(alpha + v * KT_W, &al);
        KT(store)(l + v * KT_W, &l_new);
        KT(store)(m + v * KT_W, &m_new);
    }
}

/* The variants' pass over an S^T tile of n keys (qk_tile has masked the
 * right side): softcap on each score, then the mask again, both sides (lane
 * c sees key j iff thr + j <= c <= thr + j + left, left < 0: no left bound),
 * and bmax recomputed (NaN skipped, as qk_tile).  Scalar, one tanhf per
 * score: only calls with a window's left side or softcap pay for it, and
 * every instance computes the same bits. */
KT_ATTR static void KT(variants)(float *s, int n, int64_t thr, int64_t left, float cap, float *bmax) {
    for (int c = 0; c < KT_NR; c++) bmax[c] = -INFINITY;
    for (int j = 0; j < n; j++) {
        float *row = s + (int64_t)j * KT_NR;
        for (int c = 0; c < KT_NR; c++) {
            float x = row[c];
            if (cap > 0.0f) x = cap * tanhf(x / cap);
            if (c < thr + j || (left >= 0 && c > thr + j + left)) x = -INFINITY;
            row[c] = x;
            if (x > bmax[c]) bmax[c] = x;
        }
    }
}

/* 1 if a value row of the block holds NaN or Inf (all exponent bits set).
 * Integer ops and an OR reduction, which the compiler vectorises: a float
 * sum here (x - x) cost as much as the tile's GEMMs at short rows. */
KT_ATTR static int KT(v_nonfinite)(const fattn_fwd_block *b) {
    uint32_t any = 0;
    for (int j = 0; j < b->jn; j++) {
        const float *row = b->v + (int64_t)j * b->ldv;
        for (int t = 0; t < b->dv; t++) {
            uint32_t u;
            memcpy(&u, row + t, sizeof u);
            any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
    }
    return any != 0;
}

KT_ATTR static void KT(run)(const fattn_fwd_block *b) {
    const int d = b->d, dv = b->dv;
    int vbad = -1; /* the block's value rows: -1 not looked at yet, 0 finite, 1 not */
    for (int pi = 0; pi < b->npanels; pi++) {
        const int lanes = b->rows - pi * KT_NR < KT_NR ? b->rows - pi * KT_NR : KT_NR;
        const int64_t qlo = b->q0 + (int64_t)pi * KT_NR;
        /* Keys of the block this panel's real queries see: [jlo, jn). */
        int64_t jn = qlo + lanes - 1 + b->off - b->j0 + 1;
        if (jn > b->jn) jn = b->jn;
        int64_t jlo = 0;
        if (b->left >= 0) {
            jlo = qlo + b->off - b->left - b->j0;
            if (jlo < 0) jlo = 0;
        }
        if (jn <= jlo) continue;
        const int n = (int)(jn - jlo);
        const float *qp = b->qp + (int64_t)pi * d * KT_NR;
        const float *kb = b->k + jlo * b->ldk, *vb = b->v + jlo * b->ldv;
        float *ot = b->ot + (int64_t)pi * dv * KT_NR;
        /* lane c (query qlo + c) hides key j0 + jlo + j when qlo + c + off < j0 + jlo + j */
        const int64_t thr0 = b->j0 + jlo - b->off - qlo;
        for (int c = 0; c < KT_NR; c++) b->alpha[c] = -INFINITY;
        for (int jt = 0; jt < n; jt += KT_MR)
            KT(qk)(n - jt < KT_MR ? n - jt : KT_MR, d, kb + (int64_t)jt * b->ldk, b->ldk,
                   qp, b->s + (int64_t)jt * KT_NR, thr0 + jt, b->alpha);
        if (b->left >= 0 || b->softcap > 0.0f) KT(variants)(b->s, n, thr0, b->left, b->softcap, b->alpha);
        KT(softmax)(b->s, n, b->m + (int64_t)pi * KT_NR, b->l + (int64_t)pi * KT_NR, b->alpha);
        const float *alpha = b->j0 == 0 && !b->ot_zeroed ? NULL : b->alpha;
        /* keys from jm on are hidden from some lanes (thr0 + j > 0, or a
         * window's left side: thr0 + j + left < NR - 1); they go through
         * pv_masked when a value row of the block is not finite */
        int jm = n;
        const int left_hides = b->left >= 0 && thr0 + b->left < KT_NR - 1;
        if (thr0 + n - 1 > 0 || left_hides) {
            if (vbad < 0) vbad = KT(v_nonfinite)(b);
            if (vbad) jm = left_hides || thr0 >= 1 ? 0 : (int)(1 - thr0);
        }
        for (int t0 = 0; t0 < dv; t0 += KT_MR) {
            const int mr = dv - t0 < KT_MR ? dv - t0 : KT_MR;
            KT(pv)(mr, jm, vb + t0, b->ldv, b->s, ot + (int64_t)t0 * KT_NR, alpha);
            if (jm < n) KT(pv_masked)(mr, jm, n, vb + t0, b->ldv, b->s, ot + (int64_t)t0 * KT_NR, thr0, b->left);
        }
    }
}

/* dst[t * NR + c] = src[c * lds + t], c < NR, t < n: NR rows into one panel
 * (Q^T).  8 x 8 blocks go through registers where the instance has
 * KT_TRANSPOSE8 (a quarter of the memory operations of the scalar loop). */
KT_ATTR static void KT(pack)(const float *src, int64_t lds, int n, float *dst) {
    int t0 = 0;
#ifdef KT_TRANSPOSE8
    for (; t0 + 8 <= n; t0 += 8)
        for (int c0 = 0; c0 < KT_NR; c0 += 8)
            KT_TRANSPOSE8(src + (int64_t)c0 * lds + t0, lds, dst + (int64_t)t0 * KT_NR + c0, KT_NR);
#endif
    for (int t = t0; t < n; t++)
        for (int c = 0; c < KT_NR; c++) dst[(int64_t)t * KT_NR + c] = src[(int64_t)c * lds + t];
}

/* dst[c * ldd + t] = src[t * NR + c], c < NR, t < n: one panel (O^T) back
 * into NR rows. */
KT_ATTR static void KT(unpack)(const float *src, int n, float *dst, int64_t ldd) {
    int t0 = 0;
#ifdef KT_TRANSPOSE8
    for (; t0 + 8 <= n; t0 += 8)
        for (int c0 = 0; c0 < KT_NR; c0 += 8)
            KT_TRANSPOSE8(src + (int64_t)t0 * KT_NR + c0, KT_NR, dst + (int64_t)c0 * ldd + t0, ldd);
#endif
    for (int t = t0; t < n; t++)
        for (int c = 0; c < KT_NR; c++) dst[(int64_t)c * ldd + t] = src[(int64_t)t * KT_NR + c];
}

/* x[i] = exp(x[i]), i < n, a whole vector at a time (tests). */
KT_ATTR static void KT(exp_n)(float *x, int n) {
    for (int i = 0; i < n; i += KT_W) {
        float buf[KT_W];
        for (int c = 0; c < KT_W; c++) buf[c] = i + c < n ? x[i + c] : 0.0f;
        const VT v = KT(load)(buf);
        const VT y = KT(exp)(&v);
        KT(store)(buf, &y);
        for (int c = 0; c < KT_W && i + c < n; c++) x[i + c] = buf[c];
    }
}

const fattn_fwd_kernel KT_CAT3(fattn_fwd_kernel_, KT_ISA, ) = {
    KT(run), KT(pack), KT(unpack), KT(exp_n), KT_NR, KT_BN, KT_STR(KT_ISA)};

#undef KT_NR
#undef KT_INLINE
#undef KT_SELECT
#undef KT_MAX
#undef VT
#undef VI
#undef VU
#undef KT
#undef KT_STR
#undef KT_STR_
#undef KT_CAT3
#undef KT_CAT3_
#undef KT_ISA
#undef KT_ATTR
#undef KT_W
#undef KT_NV
#undef KT_MR
#undef KT_BN
