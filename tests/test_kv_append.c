/* test_kv_append.c - fattn_kv_append on the CPU engine (fattn.h):
 *   - copies: contiguous caches and page pools (pages of 1, 16 and 64 rows
 *     in shuffled order, garbage in the table entries no new row lands in),
 *     f32 / f16 / bf16, packed, BHSD and padded layouts of the new rows and
 *     of the caches, 1 to 8 kv heads, head dims 5 .. 128, cache_seqlens 0,
 *     up to the last row of the cache, and random, seqlen_new 1 and 5, one
 *     append large enough for the context's threads: the caches, filled
 *     with random bytes first, must equal the expected bytes everywhere
 *     (the appended rows, and every other byte untouched);
 *   - random paged calls with bad lengths, bad table entries and shared
 *     pages: accepted with the expected bytes exactly when the header's
 *     rules say so (decided here, not by src/), else INVALID_ARGUMENT with
 *     the caches untouched;
 *   - every refusal of api.c and of the host check, caches untouched;
 *   - a decoding step: append into a paged cache and into a contiguous
 *     one, then fattn_fwd with block_table and seqused_k = cache_seqlens +
 *     seqlen_new gives bitwise the O and LSE of the contiguous cache and of
 *     one dense call per sequence over its prefix and new rows (the CPU
 *     engine packs every key block into the same f32 rows whatever cache it
 *     comes from, test_cpu_paged.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"
#include "internal.h" /* struct fattn_ctx, for a CUDA context faked without a GPU */

static fattn_ctx *g_ctx;

static int cdiv(int a, int b) { return (a + b - 1) / b; }

static void fill_bytes(tu_rng *rng, void *p, size_t n) {
    unsigned char *c = (unsigned char *)p;
    for (size_t i = 0; i < n; i++) c[i] = (unsigned char)(tu_rng_u64(rng) >> 56);
}

/* ---- tensors with explicit layouts ------------------------------------------------ */

enum { L_PACKED = 0, L_BHSD = 1, L_PAD = 2, L_PAD16 = 3, L_COUNT = 4 };
static const char *const layout_name[L_COUNT] = {"packed", "BHSD", "padded", "padded16"};

/* A host tensor [nb, ns, nh, d]; st: its strides (elements) resolved, the
 * fattn_tensor passes all zeros for L_PACKED. */
typedef struct tbuf {
    void *data;
    size_t bytes, es;
    int64_t st[3]; /* batch, seq, head */
    fattn_tensor t;
} tbuf;

static void tbuf_make(tbuf *x, fattn_dtype dt, int64_t nb, int64_t ns, int64_t nh, int64_t d, int layout) {
    memset(x, 0, sizeof *x);
    x->es = fattn_dtype_size(dt);
    int64_t *st = x->st;
    switch (layout) {
    case L_BHSD: st[2] = ns * d, st[1] = d, st[0] = nh * ns * d; break;
    case L_PAD: st[2] = d + 3, st[1] = nh * (d + 3) + 5, st[0] = ns * st[1] + 7; break;
    case L_PAD16: { /* pads of 16 bytes: 16-byte accesses stay possible on the GPU */
        const int64_t p = (int64_t)(16 / x->es);
        st[2] = d + p, st[1] = nh * (d + p) + p, st[0] = ns * st[1] + 2 * p;
        break;
    }
    default: st[2] = d, st[1] = nh * d, st[0] = ns * nh * d; break;
    }
    const int64_t last = (nb - 1) * st[0] + (ns - 1) * st[1] + (nh - 1) * st[2] + d;
    x->bytes = (size_t)(last + (layout == L_PAD || layout == L_PAD16 ? 9 : 0)) * x->es;
    x->data = tu_malloc(x->bytes);
    x->t.data = x->data;
    x->t.dtype = dt;
    if (layout != L_PACKED) x->t.stride_batch = st[0], x->t.stride_seq = st[1], x->t.stride_head = st[2];
}

static void tbuf_free(tbuf *x) { free(x->data); }

static char *at(const tbuf *x, int64_t b, int64_t s, int64_t h) {
    return (char *)x->data + (size_t)(b * x->st[0] + s * x->st[1] + h * x->st[2]) * x->es;
}

/* ---- one append ------------------------------------------------------------------ */

typedef struct kcase {
    fattn_dtype dt;
    int batch, sn, hkv, d;
    int ps;   /* 0: contiguous */
    int rows; /* rows a sequence can address: the capacity, or mpps * ps */
    int new_layout, cache_layout;
} kcase;

/* Everything a call needs, on the host. */
typedef struct kbufs {
    tbuf kn, vn, kc, vc;
    int32_t *seqlens, *table;
    int mpps, num_pages;
} kbufs;

static void kbufs_make(kbufs *k, const kcase *c, tu_rng *rng) {
    memset(k, 0, sizeof *k);
    tbuf_make(&k->kn, c->dt, c->batch, c->sn, c->hkv, c->d, c->new_layout);
    tbuf_make(&k->vn, c->dt, c->batch, c->sn, c->hkv, c->d, (c->new_layout + 1) % L_COUNT);
    if (c->ps) {
        k->mpps = c->rows / c->ps;
        k->num_pages = c->batch * k->mpps + 3;
        tbuf_make(&k->kc, c->dt, k->num_pages, c->ps, c->hkv, c->d, c->cache_layout);
        tbuf_make(&k->vc, c->dt, k->num_pages, c->ps, c->hkv, c->d, c->cache_layout);
        k->table = (int32_t *)tu_malloc(sizeof(int32_t) * (size_t)c->batch * k->mpps);
        int *perm = (int *)tu_malloc(sizeof(int) * (size_t)k->num_pages);
        for (int i = 0; i < k->num_pages; i++) perm[i] = i;
        for (int i = k->num_pages - 1; i > 0; i--) {
            const int j = (int)(tu_rng_u64(rng) % (uint64_t)(i + 1)), x = perm[i];
            perm[i] = perm[j], perm[j] = x;
        }
        for (int i = 0; i < c->batch * k->mpps; i++) k->table[i] = perm[i];
        free(perm);
    } else {
        tbuf_make(&k->kc, c->dt, c->batch, c->rows, c->hkv, c->d, c->cache_layout);
        tbuf_make(&k->vc, c->dt, c->batch, c->rows, c->hkv, c->d, (c->cache_layout + 2) % L_COUNT);
    }
    k->seqlens = (int32_t *)tu_malloc(sizeof(int32_t) * (size_t)c->batch);
    fill_bytes(rng, k->kn.data, k->kn.bytes);
    fill_bytes(rng, k->vn.data, k->vn.bytes);
    fill_bytes(rng, k->kc.data, k->kc.bytes);
    fill_bytes(rng, k->vc.data, k->vc.bytes);
}

static void kbufs_free(kbufs *k) {
    tbuf_free(&k->kn), tbuf_free(&k->vn), tbuf_free(&k->kc), tbuf_free(&k->vc);
    free(k->seqlens);
    free(k->table);
}

static fattn_kv_append_args args_of(const kcase *c, const kbufs *k) {
    fattn_kv_append_args a;
    memset(&a, 0, sizeof a);
    a.batch = c->batch, a.seqlen_new = c->sn, a.heads_kv = c->hkv, a.head_dim = c->d;
    a.k_new = k->kn.t, a.v_new = k->vn.t, a.k_cache = k->kc.t, a.v_cache = k->vc.t;
    a.cache_seqlens = k->seqlens;
    if (c->ps) {
        a.block_table = k->table;
        a.page_size = c->ps, a.num_pages = k->num_pages, a.max_pages_per_seq = k->mpps;
        a.capacity = -77; /* ignored with a table */
    } else {
        a.capacity = c->rows;
    }
    return a;
}

/* The expected caches: kc/vc (copies of the caches before the call) with
 * the new rows written.  Rows out of range are skipped (the CPU engine
 * refuses such calls; the GPU test's reference uses the same rule). */
static void expected_append(const kcase *c, const kbufs *k, tbuf *kc, tbuf *vc) {
    const size_t rb = k->kn.es * (size_t)c->d;
    for (int b = 0; b < c->batch; b++)
        for (int t = 0; t < c->sn; t++) {
            const int64_t pos = (int64_t)k->seqlens[b] + t;
            if (pos < 0 || pos >= c->rows) continue;
            int64_t db = b, ds = pos;
            if (c->ps) {
                db = k->table[(int64_t)b * k->mpps + pos / c->ps];
                ds = pos % c->ps;
                if (db < 0 || db >= k->num_pages) continue;
            }
            for (int h = 0; h < c->hkv; h++) {
                memcpy(at(kc, db, ds, h), at(&k->kn, b, t, h), rb);
                memcpy(at(vc, db, ds, h), at(&k->vn, b, t, h), rb);
            }
        }
}

static tbuf tbuf_copy(const tbuf *x) {
    tbuf y = *x;
    y.data = tu_malloc(x->bytes);
    memcpy(y.data, x->data, x->bytes);
    y.t.data = y.data;
    return y;
}

static int g_cases, g_cases_ok;

static void run_case(const kcase *c, tu_rng *rng, int fill, int garbage) {
    char what[160];
    snprintf(what, sizeof what, "%s batch %d sn %d hkv %d d %d %s%d new %s cache %s fill %d",
             fattn_dtype_name(c->dt), c->batch, c->sn, c->hkv, c->d, c->ps ? "page " : "capacity ",
             c->ps ? c->ps : c->rows, layout_name[c->new_layout], layout_name[c->cache_layout], fill);
    kbufs k;
    kbufs_make(&k, c, rng);
    const int room = c->rows - c->sn; /* the last start that fits */
    for (int b = 0; b < c->batch; b++)
        k.seqlens[b] = fill == 0 ? 0 : fill == 1 ? (b % 2 ? room - 1 > 0 ? room - 1 : 0 : room)
                                                 : (int32_t)(tu_rng_u64(rng) % (uint64_t)(room + 1));
    if (c->ps && garbage) /* entries no new row lands in are never read */
        for (int b = 0; b < c->batch; b++)
            for (int i = 0; i < k.mpps; i++)
                if ((int64_t)(i + 1) * c->ps <= k.seqlens[b] || (int64_t)i * c->ps >= k.seqlens[b] + c->sn)
                    k.table[b * k.mpps + i] = i % 2 ? -1 - i : INT32_MAX - i;
    tbuf ek = tbuf_copy(&k.kc), ev = tbuf_copy(&k.vc);
    expected_append(c, &k, &ek, &ev);
    const fattn_kv_append_args a = args_of(c, &k);
    const fattn_status st = fattn_kv_append(g_ctx, &a);
    g_cases++;
    TU_CHECK(st == FATTN_OK, "%s: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_ctx));
    const int same = !memcmp(ek.data, k.kc.data, ek.bytes) && !memcmp(ev.data, k.vc.data, ev.bytes);
    TU_CHECK(same, "%s: the caches differ from the expected bytes", what);
    g_cases_ok += st == FATTN_OK && same;
    tbuf_free(&ek), tbuf_free(&ev);
    kbufs_free(&k);
}

/* ---- random paged calls, valid or not --------------------------------------------- */

static int g_rand_ok, g_rand_refused;

/* The header's rules for the entries: every new row inside the table's
 * rows, its entry inside [0, num_pages), no cache row written twice. */
static int entries_valid(const kcase *c, const kbufs *k) {
    char *hit = (char *)calloc((size_t)k->num_pages * c->ps, 1);
    int ok = 1;
    for (int b = 0; b < c->batch && ok; b++)
        for (int t = 0; t < c->sn && ok; t++) {
            const int64_t pos = (int64_t)k->seqlens[b] + t;
            if (pos < 0 || pos >= c->rows) ok = 0;
            else {
                const int32_t pg = k->table[b * k->mpps + pos / c->ps];
                if (pg < 0 || pg >= k->num_pages) ok = 0;
                else if (hit[(size_t)pg * c->ps + pos % c->ps]++) ok = 0;
            }
        }
    free(hit);
    return ok;
}

static void random_calls(tu_rng *rng, int n) {
    for (int i = 0; i < n; i++) {
        kcase c = {(fattn_dtype)(i % 3), 4, 1 + (int)(tu_rng_u64(rng) % 6), 2, 8, 4, 16, i % L_COUNT, (i / 4) % L_COUNT};
        kbufs k;
        kbufs_make(&k, &c, rng);
        /* distinct pages (kbufs_make), some entries then shared with another
         * (or the same) sequence's, a few outside [0, num_pages) */
        for (int j = 0; j < c.batch * k.mpps; j++) {
            const uint64_t u = tu_rng_u64(rng) % 40;
            if (u < 2) k.table[j] = u ? -1 : k.num_pages;
            else if (u < 6) k.table[j] = k.table[tu_rng_u64(rng) % (uint64_t)(c.batch * k.mpps)];
        }
        /* mostly inside the table's rows; now and then just outside */
        for (int b = 0; b < c.batch; b++) {
            const int64_t r = (int64_t)(tu_rng_u64(rng) % (uint64_t)(c.rows - c.sn + 1));
            const uint64_t u = tu_rng_u64(rng) % 24;
            k.seqlens[b] = (int32_t)(u == 0 ? -1 - r : u == 1 ? c.rows - c.sn + 1 + r % 3 : r);
        }
        const int valid = entries_valid(&c, &k);
        tbuf ek = tbuf_copy(&k.kc), ev = tbuf_copy(&k.vc);
        if (valid) expected_append(&c, &k, &ek, &ev);
        const fattn_kv_append_args a = args_of(&c, &k);
        const fattn_status st = fattn_kv_append(g_ctx, &a);
        const int same = !memcmp(ek.data, k.kc.data, ek.bytes) && !memcmp(ev.data, k.vc.data, ev.bytes);
        TU_CHECK(st == (valid ? FATTN_OK : FATTN_ERROR_INVALID_ARGUMENT),
                 "random call %d (%s): %s (%s)", i, valid ? "valid" : "invalid", fattn_status_string(st),
                 fattn_last_error(g_ctx));
        TU_CHECK(same, "random call %d (%s, %s): the caches differ from the expected bytes", i,
                 valid ? "valid" : "invalid", fattn_status_string(st));
        if (st == FATTN_OK) g_rand_ok++;
        else g_rand_refused++;
        tbuf_free(&ek), tbuf_free(&ev);
        kbufs_free(&k);
    }
}

/* ---- refusals ---------------------------------------------------------------------- */

/* batch 2, up to 8 new rows (seqlen_new 3), 2 heads of 8 f32; pools of 9
 * pages of 4 rows, 4 table columns; cache_seqlens {5, 2}: sequence 0
 * writes rows 5..7 (column 1: page 1), sequence 1 rows 2..4 (columns 0 and
 * 1: pages 2 and 4); the columns nobody writes hold garbage.  The
 * contiguous base: capacity 10 rows. */
enum { RB = 2, RSN_MAX = 8, RH = 2, RD = 8, RPS = 4, RNP = 9, RMPPS = 4, RCAP = 10 };
#define RROW (RH * RD)
static float r_kn[RB * RSN_MAX * RROW], r_vn[RB * RSN_MAX * RROW];
static float r_kc[RNP * RPS * RROW], r_vc[RNP * RPS * RROW]; /* pools, or [RB, RCAP, ...] contiguous */
static int32_t r_seqlens[RB] = {5, 2};
static int32_t r_table[RB * RMPPS] = {6, 1, 5, -3, 2, 4, 0, 77};
static int g_refusals;

static fattn_kv_append_args refusal_base(int paged) {
    fattn_kv_append_args a;
    memset(&a, 0, sizeof a);
    a.batch = RB, a.seqlen_new = 3, a.heads_kv = RH, a.head_dim = RD;
    const fattn_tensor nt = {NULL, FATTN_DTYPE_F32, RSN_MAX * RROW, RROW, RD, NULL, 0};
    a.k_new = nt, a.v_new = nt;
    a.k_new.data = r_kn, a.v_new.data = r_vn;
    a.k_cache = fattn_tensor_bshd(r_kc, FATTN_DTYPE_F32);
    a.v_cache = fattn_tensor_bshd(r_vc, FATTN_DTYPE_F32);
    a.cache_seqlens = r_seqlens;
    if (paged) {
        a.block_table = r_table;
        a.page_size = RPS, a.num_pages = RNP, a.max_pages_per_seq = RMPPS;
    } else {
        a.capacity = RCAP;
    }
    return a;
}

/* The call answers `want` with a message holding `needle`, and neither
 * cache changed (check_caches 0: the caches are fake pointers, not read). */
static void expect_status(fattn_ctx *ctx, const fattn_kv_append_args *a, fattn_status want, const char *needle,
                          int check_caches, int line) {
    static unsigned char k0[sizeof r_kc], v0[sizeof r_vc];
    memcpy(k0, r_kc, sizeof r_kc);
    memcpy(v0, r_vc, sizeof r_vc);
    const fattn_status st = fattn_kv_append(ctx, a);
    const char *msg = fattn_last_error(ctx);
    g_refusals++;
    if (st != want || !strstr(msg, needle)) {
        tu_failures++;
        fprintf(stderr, "%s:%d: want %s naming '%s', got %s: '%s'\n", __FILE__, line, fattn_status_string(want),
                needle, fattn_status_string(st), msg);
    } else {
        printf("  [ok] line %d: %s: %s\n", line, fattn_status_string(st), msg[0] ? msg : "(no message)");
    }
    if (want != FATTN_OK && check_caches && (memcmp(k0, r_kc, sizeof r_kc) || memcmp(v0, r_vc, sizeof r_vc))) {
        tu_failures++;
        fprintf(stderr, "%s:%d: a refused call wrote the caches\n", __FILE__, line);
    }
}

#define INV FATTN_ERROR_INVALID_ARGUMENT
#define UNS FATTN_ERROR_UNSUPPORTED
#define REFUSE_IN(paged, mutation, want, needle)                                                   \
    do {                                                                                           \
        fattn_kv_append_args a_ = refusal_base(paged);                                             \
        int32_t t_[RB * RMPPS], s_[RB];                                                            \
        memcpy(t_, r_table, sizeof t_);                                                            \
        memcpy(s_, r_seqlens, sizeof s_);                                                          \
        if (a_.block_table) a_.block_table = t_;                                                   \
        a_.cache_seqlens = s_;                                                                     \
        (void)t_;                                                                                  \
        mutation;                                                                                  \
        expect_status(g_ctx, &a_, (want), (needle), 1, __LINE__);                                  \
    } while (0)
#define REFUSE(mutation, want, needle) REFUSE_IN(1, mutation, want, needle)
#define REFUSE_CONTIG(mutation, want, needle) REFUSE_IN(0, mutation, want, needle)
#define ACCEPT(paged, mutation) REFUSE_IN(paged, mutation, FATTN_OK, "")

static void check_refusals(tu_rng *rng) {
    fill_bytes(rng, r_kn, sizeof r_kn);
    fill_bytes(rng, r_vn, sizeof r_vn);
    fill_bytes(rng, r_kc, sizeof r_kc);
    fill_bytes(rng, r_vc, sizeof r_vc);

    /* the base calls */
    ACCEPT(1, (void)0);
    ACCEPT(0, (void)0);

    /* ctx and args */
    {
        const fattn_kv_append_args a = refusal_base(1);
        TU_CHECK(fattn_kv_append(NULL, &a) == INV && strstr(fattn_last_error(NULL), "ctx is NULL"),
                 "NULL ctx: '%s'", fattn_last_error(NULL));
        TU_CHECK(fattn_kv_append(g_ctx, NULL) == INV && strstr(fattn_last_error(g_ctx), "args is NULL"),
                 "NULL args: '%s'", fattn_last_error(g_ctx));
        g_refusals += 2;
    }

    /* sizes */
    REFUSE(a_.batch = 0, INV, "batch 0 must be >= 1");
    REFUSE(a_.seqlen_new = 0, INV, "seqlen_new 0 must be >= 1");
    REFUSE(a_.seqlen_new = -2, INV, "seqlen_new -2 must be >= 1");
    REFUSE(a_.heads_kv = 0, INV, "heads_kv 0 must be >= 1");
    REFUSE(a_.head_dim = 0, INV, "head_dim 0 must be >= 1");
    REFUSE(a_.head_dim = 513, UNS, "head_dim 513 is not supported by fattn_kv_append (1..512");
    REFUSE_CONTIG(a_.capacity = 0, INV, "capacity 0 must be >= 1");
    REFUSE_CONTIG(a_.capacity = -5, INV, "capacity -5 must be >= 1");
    ACCEPT(1, a_.capacity = 0); /* ignored with a table */

    /* the page ints without a table, and a table without them */
    REFUSE_CONTIG(a_.page_size = 4, INV, "page_size 4 is given but block_table is NULL");
    REFUSE_CONTIG(a_.num_pages = 9, INV, "num_pages 9 is given but block_table is NULL");
    REFUSE_CONTIG(a_.max_pages_per_seq = 1, INV, "max_pages_per_seq 1 is given but block_table is NULL");
    REFUSE(a_.page_size = 0, INV, "page_size 0 must be >= 1");
    REFUSE(a_.num_pages = -1, INV, "num_pages -1 must be >= 1");
    REFUSE(a_.max_pages_per_seq = 0, INV, "max_pages_per_seq 0 must be >= 1");

    /* dtypes */
    REFUSE(a_.k_cache.dtype = (fattn_dtype)7, INV, "k_cache.dtype 7 is not a fattn_dtype");
    REFUSE(a_.v_new.dtype = FATTN_DTYPE_F16, INV, "v_new.dtype f16 differs from k_new.dtype f32");
    REFUSE(a_.v_cache.dtype = FATTN_DTYPE_BF16, INV, "v_cache.dtype bf16 differs from k_cache.dtype f32");
    REFUSE(a_.k_cache.dtype = FATTN_DTYPE_BF16, INV, "k_cache.dtype bf16 differs from k_new.dtype f32");
    REFUSE((a_.k_new.dtype = a_.v_new.dtype = a_.k_cache.dtype = a_.v_cache.dtype = FATTN_DTYPE_E4M3), INV,
           "k_new.dtype e4m3: fattn_kv_append takes f32, f16 or bf16 new rows");
    /* an FP8 cache (0.5; test_cpu_kv8.c): both caches e4m3, with scales */
    REFUSE(a_.k_cache.dtype = FATTN_DTYPE_E4M3, INV, "v_cache.dtype f32 differs from k_cache.dtype e4m3");
    REFUSE((a_.k_cache.dtype = a_.v_cache.dtype = FATTN_DTYPE_E4M3), INV, "k_cache.scale is NULL");

    /* pointers */
    REFUSE(a_.k_new.data = NULL, INV, "k_new.data is NULL");
    REFUSE(a_.v_new.data = NULL, INV, "v_new.data is NULL");
    REFUSE(a_.k_cache.data = NULL, INV, "k_cache.data is NULL");
    REFUSE(a_.v_cache.data = NULL, INV, "v_cache.data is NULL");
    REFUSE(a_.cache_seqlens = NULL, INV, "cache_seqlens is NULL");
    REFUSE(a_.k_cache.data = (char *)r_kc + 2, INV, "k_cache.data is not 4-byte aligned");
    REFUSE(a_.v_new.data = (char *)r_vn + 1, INV, "v_new.data is not 4-byte aligned");
    {
        static int32_t room[RB * RMPPS + 1];
        memcpy((char *)room + 2, r_table, sizeof r_table);
        REFUSE(a_.block_table = (const int32_t *)((char *)room + 2), INV, "block_table is not 4-byte aligned");
        REFUSE(a_.cache_seqlens = (const int32_t *)((char *)room + 2), INV, "cache_seqlens is not 4-byte aligned");
    }

    /* strides and extents */
    REFUSE(a_.k_new.stride_seq = -1, INV, "k_new.stride_seq -1 is negative");
    REFUSE(a_.v_cache.stride_batch = -RROW, INV, "v_cache.stride_batch -16 is negative");
    REFUSE((a_.k_cache.stride_batch = RPS * RROW, a_.k_cache.stride_seq = RROW, a_.k_cache.stride_head = RD - 1),
           INV, "k_cache.stride_head 7 is smaller than head_dim 8 (heads would overlap)");
    REFUSE((a_.k_cache.stride_batch = 4, a_.k_cache.stride_seq = RROW, a_.k_cache.stride_head = RD), INV,
           "k_cache.stride_batch 4 is smaller than head_dim 8 (pages would overlap)");
    REFUSE((a_.v_cache.stride_batch = RPS * RROW, a_.v_cache.stride_seq = RD, a_.v_cache.stride_head = RD), INV,
           "elements of the output v_cache would overlap");
    REFUSE_CONTIG((a_.k_cache.stride_batch = RCAP * RROW, a_.k_cache.stride_seq = RD, a_.k_cache.stride_head = RD), INV,
                  "elements of the output k_cache would overlap");
    {
        /* extents past the engine's limits, checked without reading memory
         * (the caches are fake pointers) */
        fattn_kv_append_args a = refusal_base(0);
        a.capacity = INT32_MAX;
        a.k_cache.data = a.v_cache.data = (void *)(uintptr_t)4096;
        expect_status(g_ctx, &a, INV, "k_cache: batch * capacity * heads_kv = 2 * 2147483647 * 2 rows exceeds", 0,
                      __LINE__);
        a = refusal_base(1);
        a.k_cache.stride_batch = INT64_C(1) << 61, a.k_cache.stride_seq = RROW, a.k_cache.stride_head = RD;
        a.k_cache.data = (void *)(uintptr_t)4096;
        expect_status(g_ctx, &a, INV, "k_cache: the largest element offset", 0, __LINE__);
    }

    /* overlap: the caches are outputs, each spanning all its rows / pages */
    REFUSE(a_.v_cache.data = r_kc, INV, "v_cache overlaps k_cache");
    REFUSE(a_.k_new.data = r_kc + 400, INV, "k_cache overlaps k_new"); /* its 176 floats inside the pool */
    REFUSE((memcpy(r_vc + 3, s_, sizeof s_), a_.cache_seqlens = (const int32_t *)(r_vc + 3)), INV,
           "v_cache overlaps cache_seqlens");
    REFUSE((memcpy(r_kc + 100, t_, sizeof t_), a_.block_table = (const int32_t *)(r_kc + 100)), INV,
           "k_cache overlaps block_table");
    ACCEPT(1, a_.v_new.data = a_.k_new.data);  /* inputs may overlap */
    ACCEPT(1, a_.v_new = a_.k_new);

    /* the entries, checked on the host */
    REFUSE(s_[1] = -1, INV, "cache_seqlens[1] is -1, must be >= 0");
    REFUSE(s_[0] = 14, INV,
           "cache_seqlens[0] is 14: its 3 new rows would end at row 17, past max_pages_per_seq * page_size = 4 * 4 = 16");
    REFUSE(s_[1] = INT32_MAX, INV, "cache_seqlens[1] is 2147483647: its 3 new rows would end at row 2147483650");
    ACCEPT(1, (s_[0] = 13, t_[3] = 3)); /* rows 13..15: the last ones the table addresses */
    REFUSE_CONTIG(s_[1] = 8, INV, "cache_seqlens[1] is 8: its 3 new rows would end at row 11, past capacity 10");
    ACCEPT(0, s_[1] = 7);
    REFUSE(t_[0 * RMPPS + 1] = -1, INV, "block_table[0][1] is -1, outside [0, num_pages 9)");
    REFUSE(t_[1 * RMPPS + 1] = RNP, INV, "block_table[1][1] is 9, outside [0, num_pages 9)");
    REFUSE((s_[0] = 3, t_[0] = INT32_MIN), INV, "block_table[0][0] is -2147483648");
    /* shared pages: sequence 1's column 1 on page 1 too */
    ACCEPT(1, t_[1 * RMPPS + 1] = 1); /* page 1: rows 1..3 by sequence 0, row 0 by sequence 1 */
    REFUSE((t_[1 * RMPPS + 1] = 1, s_[1] = 3), INV,
           "row 1 of page 1 would be written twice: by sequence 1 (block_table[1][1]) and sequence 0 "
           "(block_table[0][1])");
    /* one sequence, one page in two columns (5 new rows from row 0 of 4-row pages) */
    REFUSE((a_.seqlen_new = 5, s_[0] = 0, t_[1] = t_[0]), INV,
           "row 0 of page 6 would be written twice: by sequence 0 (block_table[0][0]) and sequence 0 "
           "(block_table[0][1])");

    /* A CUDA context (faked: no GPU needed) gets api.c's checks, which read
     * nothing behind a pointer (the table and lengths are unmapped). */
    {
        static fattn_ctx fake;
        memset(&fake, 0, sizeof fake);
        fake.backend = FATTN_BACKEND_CUDA;
        const int32_t *unmapped = (const int32_t *)(uintptr_t)16;
        fattn_kv_append_args a = refusal_base(1);
        a.block_table = a.cache_seqlens = unmapped;
        a.page_size = 0;
        expect_status(&fake, &a, INV, "page_size 0 must be >= 1", 1, __LINE__);
        a.page_size = RPS;
#ifdef FATTN_WITH_CUDA
        /* the engine refuses host pointers ("not a CUDA pointer" without a
         * GPU, "not device memory" with one) */
        expect_status(&fake, &a, INV, "k_new.data (", 1, __LINE__);
#else
        expect_status(&fake, &a, FATTN_ERROR_NO_DEVICE, "without the CUDA engine", 1, __LINE__);
#endif
    }
}

/* ---- a decoding step ---------------------------------------------------------------- */

static int g_e2e, g_e2e_refs;

static void fill_values(tu_rng *rng, void *dst, size_t n, fattn_dtype dt) {
    double *x = (double *)tu_malloc(sizeof(double) * n);
    tu_fill_normal(rng, x, n);
    tu_to_dtype(x, n, dt, dst);
    free(x);
}

/* Prefix lengths L[b] already in the caches, sn new rows appended (to a
 * paged cache of 16-row pages and to a contiguous one), then the new
 * queries' causal forward over L[b] + sn keys. */
static void check_decode_step(tu_rng *rng, fattn_dtype dt, int sn, int causal) {
    enum { B = 3, HQ = 8, HK = 2, D = 64, PS = 16, MPPS = 5, CAP = PS * MPPS };
    static const int32_t prefix[B] = {0, 17, 63};
    const size_t es = fattn_dtype_size(dt), row = (size_t)HK * D;
    char what[96];
    snprintf(what, sizeof what, "decode step %s sn %d %s", fattn_dtype_name(dt), sn, causal ? "causal" : "non-causal");
    const int np = B * MPPS + 2;
    /* K/V of every sequence, prefix and new rows: [B][CAP][HK][D] in dt */
    char *kall = (char *)tu_malloc(es * B * CAP * row), *vall = (char *)tu_malloc(es * B * CAP * row);
    fill_values(rng, kall, (size_t)B * CAP * row, dt);
    fill_values(rng, vall, (size_t)B * CAP * row, dt);
    /* caches: NaN bytes everywhere, then each prefix */
    char *kp = (char *)tu_malloc(es * np * PS * row), *vp = (char *)tu_malloc(es * np * PS * row);
    char *kc = (char *)tu_malloc(es * B * CAP * row), *vc = (char *)tu_malloc(es * B * CAP * row);
    tu_poison(kp, es * np * PS * row), tu_poison(vp, es * np * PS * row);
    tu_poison(kc, es * B * CAP * row), tu_poison(vc, es * B * CAP * row);
    int32_t table[B * MPPS], perm[B * MPPS + 2];
    for (int i = 0; i < np; i++) perm[i] = i;
    for (int i = np - 1; i > 0; i--) {
        const int j = (int)(tu_rng_u64(rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    memcpy(table, perm, sizeof table);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < prefix[b]; j++) {
            const size_t src = ((size_t)b * CAP + j) * row * es;
            const size_t pg = (size_t)table[b * MPPS + j / PS], dp = (pg * PS + j % PS) * row * es;
            memcpy(kp + dp, kall + src, row * es), memcpy(vp + dp, vall + src, row * es);
            memcpy(kc + src, kall + src, row * es), memcpy(vc + src, vall + src, row * es);
        }
    /* the new rows: a [B, sn, HK, D] view of kall/vall at each prefix */
    char *kn = (char *)tu_malloc(es * B * sn * row), *vn = (char *)tu_malloc(es * B * sn * row);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < sn; t++) {
            memcpy(kn + ((size_t)b * sn + t) * row * es, kall + ((size_t)b * CAP + prefix[b] + t) * row * es, row * es);
            memcpy(vn + ((size_t)b * sn + t) * row * es, vall + ((size_t)b * CAP + prefix[b] + t) * row * es, row * es);
        }
    fattn_kv_append_args ap;
    memset(&ap, 0, sizeof ap);
    ap.batch = B, ap.seqlen_new = sn, ap.heads_kv = HK, ap.head_dim = D;
    ap.k_new = fattn_tensor_bshd(kn, dt), ap.v_new = fattn_tensor_bshd(vn, dt);
    ap.k_cache = fattn_tensor_bshd(kp, dt), ap.v_cache = fattn_tensor_bshd(vp, dt);
    ap.cache_seqlens = prefix;
    ap.block_table = table, ap.page_size = PS, ap.num_pages = np, ap.max_pages_per_seq = MPPS;
    fattn_status st = fattn_kv_append(g_ctx, &ap);
    TU_CHECK(st == FATTN_OK, "%s: paged append: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_ctx));
    ap.k_cache = fattn_tensor_bshd(kc, dt), ap.v_cache = fattn_tensor_bshd(vc, dt);
    ap.block_table = NULL, ap.page_size = ap.num_pages = ap.max_pages_per_seq = 0, ap.capacity = CAP;
    st = fattn_kv_append(g_ctx, &ap);
    TU_CHECK(st == FATTN_OK, "%s: contiguous append: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_ctx));

    /* the forward: the caller's seqused_k */
    int32_t used[B];
    for (int b = 0; b < B; b++) used[b] = prefix[b] + sn;
    const size_t nq = (size_t)B * sn * HQ * D, nlse = (size_t)B * HQ * sn;
    char *q = (char *)tu_malloc(es * nq), *o1 = (char *)tu_malloc(es * nq), *o2 = (char *)tu_malloc(es * nq);
    char *o3 = (char *)tu_malloc(es * nq / B);
    float *l1 = (float *)tu_malloc(4 * nlse), *l2 = (float *)tu_malloc(4 * nlse), *l3 = (float *)tu_malloc(4 * nlse / B);
    fill_values(rng, q, nq, dt);
    tu_poison(o1, es * nq), tu_poison(o2, es * nq), tu_poison(l1, 4 * nlse), tu_poison(l2, 4 * nlse);
    fattn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.p = tu_problem(B, sn, CAP, HQ, HK, D, 0, causal, NULL, NULL);
    f.q = fattn_tensor_bshd(q, dt);
    f.k = fattn_tensor_bshd(kp, dt), f.v = fattn_tensor_bshd(vp, dt);
    f.o = fattn_tensor_bshd(o1, dt);
    f.lse = l1;
    f.seqused_k = used;
    f.block_table = table, f.page_size = PS, f.num_pages = np, f.max_pages_per_seq = MPPS;
    st = fattn_fwd(g_ctx, &f);
    TU_CHECK(st == FATTN_OK, "%s: paged forward: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_ctx));
    f.k = fattn_tensor_bshd(kc, dt), f.v = fattn_tensor_bshd(vc, dt);
    f.o = fattn_tensor_bshd(o2, dt);
    f.lse = l2;
    f.block_table = NULL, f.page_size = f.num_pages = f.max_pages_per_seq = 0;
    st = fattn_fwd(g_ctx, &f);
    TU_CHECK(st == FATTN_OK, "%s: contiguous forward: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_ctx));
    g_e2e++;
    TU_CHECK(!memcmp(o1, o2, es * nq) && !memcmp(l1, l2, 4 * nlse),
             "%s: paged O or LSE differ from the contiguous cache's", what);
    /* one dense call per sequence over exactly its keys (kall, not the caches) */
    for (int b = 0; b < B; b++) {
        fattn_fwd_args r;
        memset(&r, 0, sizeof r);
        r.p = tu_problem(1, sn, used[b], HQ, HK, D, 0, causal, NULL, NULL);
        r.q = fattn_tensor_bshd(q + (size_t)b * sn * HQ * D * es, dt);
        r.k = fattn_tensor_bshd(kall + (size_t)b * CAP * row * es, dt);
        r.v = fattn_tensor_bshd(vall + (size_t)b * CAP * row * es, dt);
        r.o = fattn_tensor_bshd(o3, dt);
        r.lse = l3;
        st = fattn_fwd(g_ctx, &r);
        TU_CHECK(st == FATTN_OK, "%s: reference %d: %s (%s)", what, b, fattn_status_string(st), fattn_last_error(g_ctx));
        g_e2e_refs++;
        int same = !memcmp(o1 + (size_t)b * sn * HQ * D * es, o3, es * (size_t)sn * HQ * D);
        for (int h = 0; h < HQ; h++) same = same && !memcmp(l1 + ((size_t)b * HQ + h) * sn, l3 + (size_t)h * sn, 4 * (size_t)sn);
        TU_CHECK(same, "%s: sequence %d (prefix %d): O or LSE differ from the dense call over its %d keys", what, b,
                 (int)prefix[b], (int)used[b]);
    }
    free(kall), free(vall), free(kp), free(vp), free(kc), free(vc), free(kn), free(vn);
    free(q), free(o1), free(o2), free(o3), free(l1), free(l2), free(l3);
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    TU_EXPECT_OK(fattn_ctx_create(&g_ctx, FATTN_BACKEND_CPU, 0));
    if (!g_ctx) return 1;

    /* copies */
    const fattn_dtype dts[] = {FATTN_DTYPE_F32, FATTN_DTYPE_F16, FATTN_DTYPE_BF16};
    const int pages[] = {0, 1, 16, 64}, rows_of[] = {37, 37, 48, 128};
    const int hkvs[] = {1, 2, 8}, dims[] = {64, 128, 5, 96};
    int i = 0;
    for (int di = 0; di < 3; di++)
        for (int pi = 0; pi < 4; pi++)
            for (int sn = 1; sn <= 5; sn += 4)
                for (int fill = 0; fill < 3; fill++, i++) {
                    const kcase c = {dts[di], 3, sn, hkvs[i % 3], dims[i % 4], pages[pi], rows_of[pi], i % L_COUNT,
                                     (i / L_COUNT) % L_COUNT};
                    run_case(&c, &rng, fill, i % 2);
                }
    {
        /* 4.9 MB: spread over the context's threads */
        const kcase c = {FATTN_DTYPE_F32, 2, 300, 8, 128, 16, 320, L_PACKED, L_BHSD};
        TU_EXPECT_OK(fattn_ctx_set_threads(g_ctx, 2));
        run_case(&c, &rng, 2, 1);
        TU_EXPECT_OK(fattn_ctx_set_threads(g_ctx, 0));
    }
    printf("appends equal to the expected caches, bytewise: %d of %d\n", g_cases_ok, g_cases);

    random_calls(&rng, 300);
    printf("random paged calls: %d accepted with the expected bytes, %d refused untouched\n", g_rand_ok,
           g_rand_refused);
    TU_CHECK(g_rand_ok > 30 && g_rand_refused > 30, "random calls: too few of one kind (%d accepted, %d refused)",
             g_rand_ok, g_rand_refused);

    check_refusals(&rng);
    printf("refusals and acceptances checked: %d\n", g_refusals);

    for (int di = 0; di < 3; di++)
        for (int sn = 1; sn <= 5; sn += 4)
            for (int causal = 0; causal < 2; causal++) check_decode_step(&rng, dts[di], sn, causal);
    printf("decoding steps (append + paged forward == contiguous == dense, bitwise): %d, against %d dense calls\n",
           g_e2e, g_e2e_refs);

    fattn_ctx_free(g_ctx);
    return tu_finish("test_kv_append");
}
