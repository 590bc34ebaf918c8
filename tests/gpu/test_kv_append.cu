/* test_kv_append.cu - fattn_kv_append on a CUDA context (src/cuda/ops/kv_append.cu)
 * against the CPU engine's fattn_kv_append on host copies of the same bytes:
 *   - contiguous caches and page pools (pages of 1, 16, 64 rows, shuffled,
 *     garbage in the table entries no new row lands in), f32 / f16 / bf16,
 *     packed, BHSD, padded (2- and 4-byte accesses) and 16-byte padded
 *     layouts, device pointers 16-byte aligned or shifted by 2, 4 or 8 bytes
 *     (each access width of the kernel), 1 to 8 kv heads, head dims 5 .. 128,
 *     cache_seqlens 0, up to the last row and random, seqlen_new 1 and 5:
 *     the caches, random bytes first, copied back must equal the CPU's bytes
 *     everywhere (appended rows and every byte left alone);
 *   - rows whose destination is out of range (negative, past the capacity
 *     or the table's rows, INT32_MIN / INT32_MAX lengths, table entries -1,
 *     num_pages, INT32_MAX), which the CPU engine refuses: the CUDA engine
 *     skips exactly those rows, writing the others (checked against a host
 *     reference that applies the header's rule);
 *   - the call captured into a CUDA graph: two replays give the eager bytes;
 *   - host pointers refused with the caches untouched;
 *   - a decoding step on the GPU: the new rows appended into a paged
 *     (16, 64) or contiguous cache holding each sequence's prefix (NaN
 *     past it), then fattn_fwd with block_table and seqused_k =
 *     cache_seqlens + seqlen_new, against the CPU engine's append + forward
 *     on f32 copies of the same 16-bit values, within gpu_check_fwd's
 *     16-bit tolerances (gpu_testutil.h); the appended pool's bytes are also
 *     the CPU's;
 *   - FP8 caches (fp8_case): the quantised codes and scales bitwise the
 *     CPU's after each append, and the forward over them against the CPU's
 *     forward on the same bytes; scale_block 6 on pages of 16 refused.
 * Exit 77 without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "gpu/gpu_testutil.h"
#include "fattn.h"

static fattn_ctx *g_gpu, *g_cpu;

static void fill_bytes(tu_rng *rng, std::vector<uint8_t> &v) {
    for (auto &c : v) c = (uint8_t)(tu_rng_u64(rng) >> 56);
}

/* ---- tensors: a host image and its device copy ------------------------------------ */

enum { L_PACKED = 0, L_BHSD = 1, L_PAD = 2, L_PAD16 = 3, L_COUNT = 4 };
static const char *const layout_name[L_COUNT] = {"packed", "BHSD", "padded", "padded16"};

struct tbuf {
    std::vector<uint8_t> h; /* the host image */
    size_t es = 0;
    int64_t st[3] = {0, 0, 0}; /* batch, seq, head strides in elements, resolved */
    fattn_tensor t;            /* host pointer (strides 0 for packed) */
    uint8_t *dev = nullptr;    /* allocation */
    int shift = 0;             /* bytes from dev to the tensor */

    void make(fattn_dtype dt, int64_t nb, int64_t ns, int64_t nh, int64_t d, int layout, int shift_bytes) {
        es = fattn_dtype_size(dt);
        switch (layout) {
        case L_BHSD: st[2] = ns * d, st[1] = d, st[0] = nh * ns * d; break;
        case L_PAD: st[2] = d + 3, st[1] = nh * (d + 3) + 5, st[0] = ns * st[1] + 7; break;
        case L_PAD16: {
            const int64_t p = (int64_t)(16 / es);
            st[2] = d + p, st[1] = nh * (d + p) + p, st[0] = ns * st[1] + 2 * p;
            break;
        }
        default: st[2] = d, st[1] = nh * d, st[0] = ns * nh * d; break;
        }
        const int64_t last = (nb - 1) * st[0] + (ns - 1) * st[1] + (nh - 1) * st[2] + d;
        h.assign((size_t)(last + (layout == L_PAD || layout == L_PAD16 ? 9 : 0)) * es, 0);
        memset(&t, 0, sizeof t);
        t.data = h.data();
        t.dtype = dt;
        if (layout != L_PACKED) t.stride_batch = st[0], t.stride_seq = st[1], t.stride_head = st[2];
        shift = shift_bytes;
        CK(cudaMalloc(&dev, h.size() + 16));
    }
    void *dptr() const { return dev + shift; }
    fattn_tensor dtensor() const {
        fattn_tensor x = t;
        x.data = dptr();
        return x;
    }
    void upload() const { CK(cudaMemcpy(dptr(), h.data(), h.size(), cudaMemcpyHostToDevice)); }
    std::vector<uint8_t> download() const {
        std::vector<uint8_t> r(h.size());
        CK(cudaMemcpy(r.data(), dptr(), r.size(), cudaMemcpyDeviceToHost));
        return r;
    }
    uint8_t *at(std::vector<uint8_t> &img, int64_t b, int64_t s, int64_t hh) const {
        return img.data() + (size_t)(b * st[0] + s * st[1] + hh * st[2]) * es;
    }
    const uint8_t *at(int64_t b, int64_t s, int64_t hh) const {
        return h.data() + (size_t)(b * st[0] + s * st[1] + hh * st[2]) * es;
    }
    tbuf() = default;
    tbuf(const tbuf &) = delete;
    tbuf &operator=(const tbuf &) = delete;
    ~tbuf() {
        if (dev) cudaFree(dev);
    }
};

template <class T> static T *dev_copy(const std::vector<T> &v) {
    T *d = nullptr;
    CK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

/* ---- one append ------------------------------------------------------------------ */

struct kcase {
    fattn_dtype dt;
    int batch, sn, hkv, d;
    int ps;   /* 0: contiguous */
    int rows; /* capacity, or mpps * ps */
    int new_layout, cache_layout;
    int shift; /* bytes added to every device tensor pointer */
};

struct kbufs {
    tbuf kn, vn, kc, vc;
    std::vector<int32_t> seqlens, table;
    int mpps = 0, num_pages = 0;
};

static void kbufs_make(kbufs &k, const kcase &c, tu_rng *rng) {
    k.kn.make(c.dt, c.batch, c.sn, c.hkv, c.d, c.new_layout, c.shift);
    k.vn.make(c.dt, c.batch, c.sn, c.hkv, c.d, (c.new_layout + 1) % L_COUNT, c.shift);
    if (c.ps) {
        k.mpps = c.rows / c.ps;
        k.num_pages = c.batch * k.mpps + 3;
        k.kc.make(c.dt, k.num_pages, c.ps, c.hkv, c.d, c.cache_layout, c.shift);
        k.vc.make(c.dt, k.num_pages, c.ps, c.hkv, c.d, c.cache_layout, c.shift);
        std::vector<int> perm(k.num_pages);
        for (int i = 0; i < k.num_pages; i++) perm[i] = i;
        for (int i = k.num_pages - 1; i > 0; i--) std::swap(perm[i], perm[tu_rng_u64(rng) % (uint64_t)(i + 1)]);
        k.table.assign(perm.begin(), perm.begin() + (size_t)c.batch * k.mpps);
    } else {
        k.kc.make(c.dt, c.batch, c.rows, c.hkv, c.d, c.cache_layout, c.shift);
        k.vc.make(c.dt, c.batch, c.rows, c.hkv, c.d, (c.cache_layout + 2) % L_COUNT, c.shift);
    }
    k.seqlens.assign(c.batch, 0);
    fill_bytes(rng, k.kn.h), fill_bytes(rng, k.vn.h), fill_bytes(rng, k.kc.h), fill_bytes(rng, k.vc.h);
}

/* host pointers (dev = false) or device pointers */
static fattn_kv_append_args args_of(const kcase &c, const kbufs &k, bool dev, const int32_t *dseq, const int32_t *dtab) {
    fattn_kv_append_args a;
    memset(&a, 0, sizeof a);
    a.batch = c.batch, a.seqlen_new = c.sn, a.heads_kv = c.hkv, a.head_dim = c.d;
    a.k_new = dev ? k.kn.dtensor() : k.kn.t;
    a.v_new = dev ? k.vn.dtensor() : k.vn.t;
    a.k_cache = dev ? k.kc.dtensor() : k.kc.t;
    a.v_cache = dev ? k.vc.dtensor() : k.vc.t;
    a.cache_seqlens = dev ? dseq : k.seqlens.data();
    if (c.ps) {
        a.block_table = dev ? dtab : k.table.data();
        a.page_size = c.ps, a.num_pages = k.num_pages, a.max_pages_per_seq = k.mpps;
    } else {
        a.capacity = c.rows;
    }
    return a;
}

/* The header's rule, on the host images: new rows whose destination is out
 * of range are skipped. */
static void reference(const kcase &c, const kbufs &k, std::vector<uint8_t> &kc, std::vector<uint8_t> &vc) {
    const size_t rb = k.kn.es * (size_t)c.d;
    for (int b = 0; b < c.batch; b++)
        for (int t = 0; t < c.sn; t++) {
            const int64_t pos = (int64_t)k.seqlens[b] + t;
            if (pos < 0 || pos >= c.rows) continue;
            int64_t db = b, ds = pos;
            if (c.ps) {
                db = k.table[(size_t)b * k.mpps + pos / c.ps];
                ds = pos % c.ps;
                if (db < 0 || db >= k.num_pages) continue;
            }
            for (int h = 0; h < c.hkv; h++) {
                memcpy(k.kc.at(kc, db, ds, h), k.kn.at(b, t, h), rb);
                memcpy(k.vc.at(vc, db, ds, h), k.vn.at(b, t, h), rb);
            }
        }
}

static int g_cases, g_cases_ok, g_skip_cases;
static int g_width[17]; /* cases by the access width the kernel can use */

/* The widest access (16, 8, 4, 2 bytes) that the device addresses, the byte
 * strides of the dimensions of extent > 1 and the row's bytes allow: the
 * header's promise of 16-byte accesses, for the coverage count only. */
static int access_width(const kcase &c, const kbufs &k) {
    uint64_t bits = 16u | (uint64_t)c.d * k.kn.es;
    const tbuf *t[4] = {&k.kn, &k.vn, &k.kc, &k.vc};
    const int64_t cb = c.ps ? k.num_pages : c.batch, cs = c.ps ? c.ps : c.rows;
    const int64_t ext[4][3] = {{c.batch, c.sn, c.hkv}, {c.batch, c.sn, c.hkv}, {cb, cs, c.hkv}, {cb, cs, c.hkv}};
    for (int i = 0; i < 4; i++) {
        bits |= (uint64_t)(uintptr_t)t[i]->dptr();
        for (int j = 0; j < 3; j++)
            if (ext[i][j] > 1) bits |= (uint64_t)(t[i]->st[j] * (int64_t)t[i]->es);
    }
    return (int)(bits & (~bits + 1));
}

/* valid: the CPU engine must accept the call and give the expected bytes;
 * else it must refuse it, and the GPU result is checked against the host
 * reference alone.  graph: also capture the call and replay it. */
static void run_case(const kcase &c, kbufs &k, const char *what, bool valid, bool graph) {
    std::vector<uint8_t> ek = k.kc.h, ev = k.vc.h;
    reference(c, k, ek, ev);
    if (valid) {
        /* the CPU engine on host copies of the caches */
        std::vector<uint8_t> ck = k.kc.h, cv = k.vc.h;
        fattn_kv_append_args a = args_of(c, k, false, nullptr, nullptr);
        a.k_cache.data = ck.data(), a.v_cache.data = cv.data();
        const fattn_status st = fattn_kv_append(g_cpu, &a);
        TU_CHECK(st == FATTN_OK, "%s: CPU engine: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_cpu));
        TU_CHECK(ck == ek && cv == ev, "%s: the CPU engine differs from the host reference", what);
    } else {
        std::vector<uint8_t> ck = k.kc.h, cv = k.vc.h;
        fattn_kv_append_args a = args_of(c, k, false, nullptr, nullptr);
        a.k_cache.data = ck.data(), a.v_cache.data = cv.data();
        const fattn_status st = fattn_kv_append(g_cpu, &a);
        TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT && ck == k.kc.h && cv == k.vc.h,
                 "%s: the CPU engine should refuse the call untouched: %s (%s)", what, fattn_status_string(st),
                 fattn_last_error(g_cpu));
        g_skip_cases++;
    }
    int32_t *dseq = dev_copy(k.seqlens), *dtab = c.ps ? dev_copy(k.table) : nullptr;
    k.kn.upload(), k.vn.upload(), k.kc.upload(), k.vc.upload();
    const fattn_kv_append_args a = args_of(c, k, true, dseq, dtab);
    fattn_status st = fattn_kv_append(g_gpu, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_gpu));
    CK(cudaDeviceSynchronize());
    bool same = k.kc.download() == ek && k.vc.download() == ev;
    TU_CHECK(same, "%s: the caches differ from the %s", what, valid ? "CPU engine's" : "host reference (rows skipped)");
    g_cases++;
    g_width[access_width(c, k)]++;
    if (graph && st == FATTN_OK) {
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        TU_CHECK(fattn_ctx_set_stream(g_gpu, s) == FATTN_OK, "%s: set_stream", what);
        cudaGraph_t gr = nullptr;
        cudaGraphExec_t ex = nullptr;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        const fattn_status fs = fattn_kv_append(g_gpu, &a);
        cudaError_t e = cudaStreamEndCapture(s, &gr);
        TU_CHECK(fs == FATTN_OK, "%s: call during capture: %s (%s)", what, fattn_status_string(fs), fattn_last_error(g_gpu));
        TU_CHECK(e == cudaSuccess, "%s: end capture: %s", what, cudaGetErrorString(e));
        bool ok = fs == FATTN_OK && e == cudaSuccess;
        if (ok) {
            e = cudaGraphInstantiate(&ex, gr, 0);
            TU_CHECK(e == cudaSuccess, "%s: instantiate: %s", what, cudaGetErrorString(e));
            ok = e == cudaSuccess;
        }
        for (int r = 0; ok && r < 2; ++r) {
            k.kc.upload(), k.vc.upload(); /* the caches as before the call */
            /* a pageable cudaMemcpy may return before its DMA lands, and s does
             * not wait for the legacy stream: without this the replay raced the
             * upload (run s20-5: this case failed, every eager case passed) */
            CK(cudaDeviceSynchronize());
            e = cudaGraphLaunch(ex, s);
            if (e == cudaSuccess) e = cudaStreamSynchronize(s);
            TU_CHECK(e == cudaSuccess, "%s: replay %d: %s", what, r, cudaGetErrorString(e));
            ok = e == cudaSuccess && k.kc.download() == ek && k.vc.download() == ev;
            TU_CHECK(ok, "%s: replay %d differs from the eager call", what, r);
        }
        printf("  [%s] %s: captured into a CUDA graph, two replays: the eager call's bytes\n", ok ? "ok" : "FAIL", what);
        (void)cudaGetLastError();
        fattn_ctx_set_stream(g_gpu, NULL);
        if (ex) cudaGraphExecDestroy(ex);
        if (gr) cudaGraphDestroy(gr);
        cudaStreamDestroy(s);
        same = same && ok;
    }
    g_cases_ok += same && st == FATTN_OK;
    cudaFree(dseq);
    if (dtab) cudaFree(dtab);
}

static void copy_cases(tu_rng *rng) {
    const fattn_dtype dts[] = {FATTN_DTYPE_F32, FATTN_DTYPE_F16, FATTN_DTYPE_BF16};
    const int pages[] = {0, 1, 16, 64}, rows_of[] = {37, 37, 48, 128};
    const int hkvs[] = {1, 2, 8}, dims[] = {64, 128, 5, 96, 8};
    const int shifts[] = {0, 8, 4, 2};
    int i = 0;
    for (int di = 0; di < 3; di++)
        for (int pi = 0; pi < 4; pi++)
            for (int sn = 1; sn <= 5; sn += 4)
                for (int fill = 0; fill < 3; fill++, i++) {
                    kcase c = {dts[di], 3, sn, hkvs[i % 3], dims[i % 5], pages[pi], rows_of[pi], i % L_COUNT,
                               (i / L_COUNT) % L_COUNT, shifts[i % 4]};
                    if (c.dt == FATTN_DTYPE_F32 && c.shift == 2) c.shift = 4; /* f32 pointers are 4-byte aligned */
                    /* every 4th case all packed and aligned, so that plenty take 16-byte accesses */
                    if (i % 4 == 0) c.new_layout = c.cache_layout = i % 8 ? L_PAD16 : L_PACKED, c.shift = 0;
                    kbufs k;
                    kbufs_make(k, c, rng);
                    const int room = c.rows - c.sn;
                    for (int b = 0; b < c.batch; b++)
                        k.seqlens[b] = fill == 0 ? 0 : fill == 1 ? (b % 2 ? (room > 0 ? room - 1 : 0) : room)
                                                                 : (int32_t)(tu_rng_u64(rng) % (uint64_t)(room + 1));
                    if (c.ps && i % 2)
                        for (int b = 0; b < c.batch; b++)
                            for (int j = 0; j < k.mpps; j++)
                                if ((int64_t)(j + 1) * c.ps <= k.seqlens[b] || (int64_t)j * c.ps >= k.seqlens[b] + c.sn)
                                    k.table[(size_t)b * k.mpps + j] = j % 2 ? -1 - j : INT32_MAX - j;
                    char what[192];
                    snprintf(what, sizeof what, "%s batch %d sn %d hkv %d d %d %s%d new %s cache %s shift %d fill %d",
                             fattn_dtype_name(c.dt), c.batch, c.sn, c.hkv, c.d, c.ps ? "page " : "capacity ",
                             c.ps ? c.ps : c.rows, layout_name[c.new_layout], layout_name[c.cache_layout], c.shift, fill);
                    run_case(c, k, what, true, i == 20);
                }
    for (int pi = 0; pi < 2; pi++) {
        /* every pointer 8 bytes past a 16-byte boundary, packed rows of 128 bytes:
         * 8-byte accesses, whatever the loop above drew (on the H200 none of
         * its cases did) */
        kcase c = {FATTN_DTYPE_BF16, 2, 3, 2, 64, pi ? 16 : 0, pi ? 48 : 37, L_PACKED, L_PACKED, 8};
        kbufs k;
        kbufs_make(k, c, rng);
        k.seqlens[0] = 0, k.seqlens[1] = c.rows - c.sn;
        run_case(c, k, pi ? "bf16 8-byte accesses, paged" : "bf16 8-byte accesses, contiguous", true, false);
    }
    {
        /* a prefill-sized append: more rows than the grid's CTAs cover at once */
        kcase c = {FATTN_DTYPE_BF16, 2, 3000, 8, 128, 16, 3200, L_PACKED, L_BHSD, 0};
        kbufs k;
        kbufs_make(k, c, rng);
        k.seqlens[0] = 0, k.seqlens[1] = 200;
        run_case(c, k, "bf16 prefill 2 x 3000 rows, 8 heads of 128, pages of 16", true, false);
    }
}

/* Out-of-range destinations: skipped on the GPU, refused on the CPU. */
static void skip_cases(tu_rng *rng) {
    {
        kcase c = {FATTN_DTYPE_BF16, 6, 5, 2, 64, 0, 37, L_PACKED, L_PACKED, 0};
        kbufs k;
        kbufs_make(k, c, rng);
        const int32_t s[6] = {-3, 34, 37, INT32_MAX, INT32_MIN, 10};
        k.seqlens.assign(s, s + 6);
        run_case(c, k, "contiguous: lengths -3 (2 of 5 rows fit), 34 (3 fit), 37, INT32_MAX, INT32_MIN, 10", false, false);
    }
    {
        kcase c = {FATTN_DTYPE_F16, 4, 5, 2, 40, 16, 48, L_PAD, L_PACKED, 0};
        kbufs k;
        kbufs_make(k, c, rng);
        const int32_t s[4] = {14, -2, 46, 20};
        k.seqlens.assign(s, s + 4);
        k.table[0 * k.mpps + 1] = -1;          /* sequence 0: rows 16..18 skipped, 14..15 written */
        k.table[3 * k.mpps + 1] = k.num_pages; /* sequence 3: every row (20..24) skipped */
        run_case(c, k, "paged 16: length -2, rows past the table (46 + 5 > 48), entries -1 and num_pages", false, true);
    }
    {
        kcase c = {FATTN_DTYPE_F32, 3, 5, 1, 16, 1, 12, L_PACKED, L_BHSD, 0};
        kbufs k;
        kbufs_make(k, c, rng);
        const int32_t s[3] = {0, 9, 3};
        k.seqlens.assign(s, s + 3);
        k.table[0 * k.mpps + 2] = INT32_MAX, k.table[1 * k.mpps + 9] = -7, k.table[2 * k.mpps + 3] = INT32_MIN;
        run_case(c, k, "paged 1: entries INT32_MAX, -7, INT32_MIN for single rows; rows 12, 13 past the table", false,
                 false);
    }
}

/* ---- refusals ---------------------------------------------------------------------- */

static void refusals(tu_rng *rng) {
    kcase c = {FATTN_DTYPE_BF16, 2, 3, 2, 64, 16, 64, L_PACKED, L_PACKED, 0};
    kbufs k;
    kbufs_make(k, c, rng);
    k.seqlens[0] = 3, k.seqlens[1] = 20;
    int32_t *dseq = dev_copy(k.seqlens), *dtab = dev_copy(k.table);
    k.kc.upload(), k.vc.upload();
    struct {
        const char *needle;
        int which;
    } tries[] = {{"cache_seqlens (", 0}, {"block_table (", 1}, {"k_cache.data (", 2}, {"v_new.data (", 3}};
    for (const auto &x : tries) {
        fattn_kv_append_args a = args_of(c, k, true, dseq, dtab);
        if (x.which == 0) a.cache_seqlens = k.seqlens.data();
        if (x.which == 1) a.block_table = k.table.data();
        if (x.which == 2) a.k_cache = k.kc.t;
        if (x.which == 3) a.v_new = k.vn.t;
        const fattn_status st = fattn_kv_append(g_gpu, &a);
        CK(cudaDeviceSynchronize());
        const char *msg = fattn_last_error(g_gpu);
        const bool ok = st == FATTN_ERROR_INVALID_ARGUMENT && strstr(msg, x.needle) && strstr(msg, "not device memory");
        TU_CHECK(ok, "host pointer: want INVALID_ARGUMENT naming '%s', got %s: '%s'", x.needle, fattn_status_string(st), msg);
        TU_CHECK(k.kc.download() == k.kc.h && k.vc.download() == k.vc.h, "host pointer '%s': a refused call wrote the caches",
                 x.needle);
        if (ok) printf("  [ok] %s: %s\n", fattn_status_string(st), msg);
    }
    cudaFree(dseq);
    cudaFree(dtab);
}

/* ---- a decoding step ----------------------------------------------------------------- */

static void decode_step(tu_rng *rng, fattn_dtype dt, int d, int ps, int sn, int causal) {
    const int B = 4, HQ = 8, HK = 2;
    const int32_t prefix[4] = {0, 17, 100, 300};
    const int maxlen = 300 + sn;
    const int mpps = ps ? (maxlen + ps - 1) / ps + 1 : 0; /* one spare column */
    const int rows = ps ? mpps * ps : maxlen + 7;         /* rows a sequence addresses */
    const int np = ps ? B * mpps + 3 : B;                 /* pages, or sequences of a contiguous cache */
    const int prow = ps ? ps : rows;                      /* rows per page (contiguous: per sequence) */
    const size_t row = (size_t)HK * d;
    char what[128];
    snprintf(what, sizeof what, "decode %s d%d %s%d sn %d %s", fattn_dtype_name(dt), d, ps ? "page " : "contiguous ",
             ps ? ps : rows, sn, causal ? "causal" : "non-causal");
    /* every key of every sequence (prefix and new rows), rounded to dt */
    std::vector<double> kall((size_t)B * maxlen * row), vall(kall.size()), q((size_t)B * sn * HQ * d);
    tu_fill_normal(rng, kall.data(), kall.size());
    tu_fill_normal(rng, vall.data(), vall.size());
    tu_fill_normal(rng, q.data(), q.size());
    tu_round_to(kall.data(), kall.size(), dt), tu_round_to(vall.data(), vall.size(), dt), tu_round_to(q.data(), q.size(), dt);
    std::vector<int32_t> table;
    if (ps) {
        std::vector<int> perm(np);
        for (int i = 0; i < np; i++) perm[i] = i;
        for (int i = np - 1; i > 0; i--) std::swap(perm[i], perm[tu_rng_u64(rng) % (uint64_t)(i + 1)]);
        table.assign(perm.begin(), perm.begin() + (size_t)B * mpps);
    }
    auto slot = [&](int b, int j) -> size_t { /* element offset of key j of sequence b in the cache */
        const size_t pg = ps ? (size_t)table[(size_t)b * mpps + j / ps] : (size_t)b;
        return (pg * prow + (size_t)(ps ? j % ps : j)) * row;
    };
    const size_t ncache = (size_t)np * prow * row;
    /* caches: 16-bit for the GPU (0xFFFF: NaN), f32 for the CPU reference (NaN) */
    std::vector<uint16_t> kc16(ncache, 0xFFFF), vc16(ncache, 0xFFFF);
    std::vector<float> kc32(ncache, NAN), vc32(ncache, NAN);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < prefix[b]; j++) {
            const size_t src = ((size_t)b * maxlen + j) * row, dst = slot(b, j);
            tu_to_dtype(&kall[src], row, dt, &kc16[dst]), tu_to_dtype(&vall[src], row, dt, &vc16[dst]);
            tu_to_dtype(&kall[src], row, FATTN_DTYPE_F32, &kc32[dst]), tu_to_dtype(&vall[src], row, FATTN_DTYPE_F32, &vc32[dst]);
        }
    /* the new rows [B, sn, HK, d] */
    std::vector<double> kn((size_t)B * sn * row), vn(kn.size());
    for (int b = 0; b < B; b++)
        for (int t = 0; t < sn; t++) {
            memcpy(&kn[((size_t)b * sn + t) * row], &kall[((size_t)b * maxlen + prefix[b] + t) * row], row * 8);
            memcpy(&vn[((size_t)b * sn + t) * row], &vall[((size_t)b * maxlen + prefix[b] + t) * row], row * 8);
        }
    std::vector<uint16_t> kn16(kn.size()), vn16(kn.size()), q16(q.size());
    std::vector<float> kn32(kn.size()), vn32(kn.size()), q32(q.size());
    tu_to_dtype(kn.data(), kn.size(), dt, kn16.data()), tu_to_dtype(vn.data(), vn.size(), dt, vn16.data());
    tu_to_dtype(q.data(), q.size(), dt, q16.data());
    tu_to_dtype(kn.data(), kn.size(), FATTN_DTYPE_F32, kn32.data()), tu_to_dtype(vn.data(), vn.size(), FATTN_DTYPE_F32, vn32.data());
    tu_to_dtype(q.data(), q.size(), FATTN_DTYPE_F32, q32.data());
    std::vector<int32_t> seqlens(prefix, prefix + B), used(B);
    for (int b = 0; b < B; b++) used[b] = prefix[b] + sn;

    fattn_kv_append_args ap;
    memset(&ap, 0, sizeof ap);
    ap.batch = B, ap.seqlen_new = sn, ap.heads_kv = HK, ap.head_dim = d;
    if (ps) ap.page_size = ps, ap.num_pages = np, ap.max_pages_per_seq = mpps;
    else ap.capacity = rows;
    fattn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.p = tu_problem(B, sn, rows, HQ, HK, d, 0, causal, NULL, NULL);
    if (ps) f.page_size = ps, f.num_pages = np, f.max_pages_per_seq = mpps;
    const size_t nq = q.size(), nlse = (size_t)B * HQ * sn;

    /* CPU: the 16-bit cache's expected bytes, and the f32 reference */
    std::vector<uint16_t> ek = kc16, ev = vc16;
    ap.k_new = fattn_tensor_bshd(kn16.data(), dt), ap.v_new = fattn_tensor_bshd(vn16.data(), dt);
    ap.k_cache = fattn_tensor_bshd(ek.data(), dt), ap.v_cache = fattn_tensor_bshd(ev.data(), dt);
    ap.cache_seqlens = seqlens.data();
    ap.block_table = ps ? table.data() : NULL;
    fattn_status st = fattn_kv_append(g_cpu, &ap);
    TU_CHECK(st == FATTN_OK, "%s: CPU append (16-bit): %s (%s)", what, fattn_status_string(st), fattn_last_error(g_cpu));
    ap.k_new = fattn_tensor_bshd(kn32.data(), FATTN_DTYPE_F32), ap.v_new = fattn_tensor_bshd(vn32.data(), FATTN_DTYPE_F32);
    ap.k_cache = fattn_tensor_bshd(kc32.data(), FATTN_DTYPE_F32), ap.v_cache = fattn_tensor_bshd(vc32.data(), FATTN_DTYPE_F32);
    st = fattn_kv_append(g_cpu, &ap);
    TU_CHECK(st == FATTN_OK, "%s: CPU append (f32): %s (%s)", what, fattn_status_string(st), fattn_last_error(g_cpu));
    std::vector<float> o32(nq), l32(nlse);
    f.q = fattn_tensor_bshd(q32.data(), FATTN_DTYPE_F32);
    f.k = fattn_tensor_bshd(kc32.data(), FATTN_DTYPE_F32), f.v = fattn_tensor_bshd(vc32.data(), FATTN_DTYPE_F32);
    f.o = fattn_tensor_bshd(o32.data(), FATTN_DTYPE_F32);
    f.lse = l32.data();
    f.seqused_k = used.data();
    f.block_table = ps ? table.data() : NULL;
    st = fattn_fwd(g_cpu, &f);
    TU_CHECK(st == FATTN_OK, "%s: CPU forward: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_cpu));

    /* GPU: append, then the forward on the cache */
    uint16_t *dkc = dev_copy(kc16), *dvc = dev_copy(vc16), *dkn = dev_copy(kn16), *dvn = dev_copy(vn16), *dq = dev_copy(q16);
    int32_t *dseq = dev_copy(seqlens), *dused = dev_copy(used), *dtab = ps ? dev_copy(table) : nullptr;
    uint16_t *dout;
    float *dlse;
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemset(dout, 0xFF, nq * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    ap.k_new = fattn_tensor_bshd(dkn, dt), ap.v_new = fattn_tensor_bshd(dvn, dt);
    ap.k_cache = fattn_tensor_bshd(dkc, dt), ap.v_cache = fattn_tensor_bshd(dvc, dt);
    ap.cache_seqlens = dseq;
    ap.block_table = dtab;
    st = fattn_kv_append(g_gpu, &ap);
    TU_CHECK(st == FATTN_OK, "%s: GPU append: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_gpu));
    f.q = fattn_tensor_bshd(dq, dt);
    f.k = fattn_tensor_bshd(dkc, dt), f.v = fattn_tensor_bshd(dvc, dt);
    f.o = fattn_tensor_bshd(dout, dt);
    f.lse = dlse;
    f.seqused_k = dused;
    f.block_table = dtab;
    st = fattn_fwd(g_gpu, &f);
    TU_CHECK(st == FATTN_OK, "%s: GPU forward: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_gpu));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> gk(ncache), gv(ncache), go(nq);
    std::vector<float> gl(nlse);
    CK(cudaMemcpy(gk.data(), dkc, ncache * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gv.data(), dvc, ncache * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(go.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gl.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    TU_CHECK(gk == ek && gv == ev, "%s: the appended cache differs from the CPU engine's bytes", what);
    if (st == FATTN_OK) {
        std::vector<double> got(nq), ref(nq), rl(nlse);
        tu_from_dtype(go.data(), nq, dt, got.data());
        tu_from_dtype(o32.data(), nq, FATTN_DTYPE_F32, ref.data());
        for (size_t i = 0; i < nlse; i++) rl[i] = l32[i];
        gpu_check_fwd(what, dt, got.data(), ref.data(), nq, d, gl.data(), rl.data(), nlse);
    }
    cudaFree(dkc), cudaFree(dvc), cudaFree(dkn), cudaFree(dvn), cudaFree(dq), cudaFree(dseq), cudaFree(dused);
    if (dtab) cudaFree(dtab);
    cudaFree(dout), cudaFree(dlse);
}

/* ---- FP8 caches (fattn.h 0.5) ------------------------------------------------------
 * A few appends (5 rows, then 1, then 3) into e4m3 caches whose rows and
 * scales start as random codes (no NaN) and random positive scales, as if
 * earlier appends had written them: the GPU's codes and scales after each
 * append must be the CPU's bytes (the same quantiser: e4m3_quant.cuh), runs
 * that start a scale block and runs that keep its stored scale (and
 * saturate) both.  Then fattn_fwd on the GPU over the cache (block table,
 * seqused_k, GQA, causal or not) against the CPU engine's forward on the
 * same bytes with f32 queries holding the same 16-bit values, within
 * gpu_check_fwd's 16-bit tolerances: the e4m3 values are in both. */
static int g_fp8_steps, g_fp8_ok;

static void fp8_case(tu_rng *rng, fattn_dtype dt, int d, int ps, int sbk, int sbv, int causal) {
    const int B = 4, HQ = 8, HK = 2, steps[3] = {5, 1, 3};
    const int32_t prefix[4] = {0, 13, 16, 70};
    const int maxlen = 70 + 9;
    const int mpps = ps ? (maxlen + ps - 1) / ps + 1 : 0;
    const int rows = ps ? mpps * ps : maxlen + 5;
    const int np = ps ? B * mpps + 3 : B;
    const int prow = ps ? ps : rows;
    const size_t row = (size_t)HK * d, ncache = (size_t)np * prow * row;
    const int nbk = (prow + sbk - 1) / sbk, nbv = (prow + sbv - 1) / sbv;
    char what[160];
    snprintf(what, sizeof what, "fp8 cache %s d%d %s%d scale_block k %d v %d %s", fattn_dtype_name(dt), d,
             ps ? "page " : "contiguous ", ps ? ps : rows, sbk, sbv, causal ? "causal" : "non-causal");
    std::vector<int32_t> table;
    if (ps) {
        std::vector<int> perm(np);
        for (int i = 0; i < np; i++) perm[i] = i;
        for (int i = np - 1; i > 0; i--) std::swap(perm[i], perm[tu_rng_u64(rng) % (uint64_t)(i + 1)]);
        table.assign(perm.begin(), perm.begin() + (size_t)B * mpps);
    }
    std::vector<uint8_t> kc(ncache), vc(ncache);
    fill_bytes(rng, kc), fill_bytes(rng, vc);
    for (auto *c : {&kc, &vc})
        for (auto &x : *c)
            if ((x & 0x7F) == 0x7F) x = 0; /* no NaN codes in the prefix the forward reads */
    std::vector<float> ks((size_t)np * HK * nbk), vs((size_t)np * HK * nbv);
    for (auto &x : ks) x = (float)(0.002 + 0.01 * tu_rng_uniform(rng));
    for (auto &x : vs) x = (float)(0.002 + 0.01 * tu_rng_uniform(rng));
    uint8_t *dkc, *dvc;
    float *dks, *dvs;
    int32_t *dseq, *dtab = NULL, *dused;
    CK(cudaMalloc(&dkc, ncache));
    CK(cudaMalloc(&dvc, ncache));
    CK(cudaMalloc(&dks, ks.size() * 4));
    CK(cudaMalloc(&dvs, vs.size() * 4));
    CK(cudaMalloc(&dseq, B * 4));
    CK(cudaMalloc(&dused, B * 4));
    CK(cudaMemcpy(dkc, kc.data(), ncache, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dvc, vc.data(), ncache, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dks, ks.data(), ks.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dvs, vs.data(), vs.size() * 4, cudaMemcpyHostToDevice));
    if (ps) {
        CK(cudaMalloc(&dtab, table.size() * 4));
        CK(cudaMemcpy(dtab, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<int32_t> pos(prefix, prefix + B);
    int sn = 0;
    for (int st = 0; st < 3; st++) {
        sn = steps[st];
        std::vector<double> x((size_t)B * sn * row), y(x.size());
        tu_fill_normal(rng, x.data(), x.size()), tu_fill_normal(rng, y.data(), y.size());
        for (size_t i = 0; i < x.size(); i += 7) x[i] *= 8.0; /* beyond some stored scales: saturation */
        const size_t es = fattn_dtype_size(dt);
        std::vector<uint8_t> xn(x.size() * es), yn(x.size() * es);
        tu_to_dtype(x.data(), x.size(), dt, xn.data()), tu_to_dtype(y.data(), y.size(), dt, yn.data());
        void *dxn, *dyn;
        CK(cudaMalloc(&dxn, xn.size()));
        CK(cudaMalloc(&dyn, yn.size()));
        CK(cudaMemcpy(dxn, xn.data(), xn.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dyn, yn.data(), yn.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dseq, pos.data(), B * 4, cudaMemcpyHostToDevice));
        fattn_kv_append_args a;
        memset(&a, 0, sizeof a);
        a.batch = B, a.seqlen_new = sn, a.heads_kv = HK, a.head_dim = d;
        if (ps) a.page_size = ps, a.num_pages = np, a.max_pages_per_seq = mpps;
        else a.capacity = rows;
        fattn_kv_append_args h = a, g = a;
        h.k_new = fattn_tensor_bshd(xn.data(), dt), h.v_new = fattn_tensor_bshd(yn.data(), dt);
        h.k_cache = fattn_tensor_bshd(kc.data(), FATTN_DTYPE_E4M3), h.v_cache = fattn_tensor_bshd(vc.data(), FATTN_DTYPE_E4M3);
        h.k_cache.scale = ks.data(), h.v_cache.scale = vs.data();
        h.cache_seqlens = pos.data(), h.block_table = ps ? table.data() : NULL;
        g.k_new = fattn_tensor_bshd(dxn, dt), g.v_new = fattn_tensor_bshd(dyn, dt);
        g.k_cache = fattn_tensor_bshd(dkc, FATTN_DTYPE_E4M3), g.v_cache = fattn_tensor_bshd(dvc, FATTN_DTYPE_E4M3);
        g.k_cache.scale = dks, g.v_cache.scale = dvs;
        g.cache_seqlens = dseq, g.block_table = dtab;
        h.k_cache.scale_block = g.k_cache.scale_block = sbk;
        h.v_cache.scale_block = g.v_cache.scale_block = sbv;
        fattn_status s1 = fattn_kv_append(g_cpu, &h), s2 = fattn_kv_append(g_gpu, &g);
        TU_CHECK(s1 == FATTN_OK && s2 == FATTN_OK, "%s step %d: cpu %s (%s), gpu %s (%s)", what, st,
                 fattn_status_string(s1), fattn_last_error(g_cpu), fattn_status_string(s2), fattn_last_error(g_gpu));
        CK(cudaDeviceSynchronize());
        std::vector<uint8_t> gk(ncache), gv(ncache);
        std::vector<float> gks(ks.size()), gvs(vs.size());
        CK(cudaMemcpy(gk.data(), dkc, ncache, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gv.data(), dvc, ncache, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gks.data(), dks, ks.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gvs.data(), dvs, vs.size() * 4, cudaMemcpyDeviceToHost));
        const bool ok = gk == kc && gv == vc && memcmp(gks.data(), ks.data(), ks.size() * 4) == 0 &&
                        memcmp(gvs.data(), vs.data(), vs.size() * 4) == 0;
        TU_CHECK(ok, "%s step %d (%d new rows): the GPU's codes or scales differ from the CPU's", what, st, sn);
        g_fp8_steps++, g_fp8_ok += ok;
        for (int b = 0; b < B; b++) pos[b] += sn;
        cudaFree(dxn), cudaFree(dyn);
    }
    /* the forward over every used key: the GPU on its cache, the CPU on the same bytes */
    const size_t nq = (size_t)B * sn * HQ * d, nlse = (size_t)B * HQ * sn;
    std::vector<double> q(nq);
    tu_fill_normal(rng, q.data(), nq);
    std::vector<uint16_t> q16(nq), o16(nq);
    std::vector<float> q32(nq), o32(nq), lse32(nlse), glse(nlse);
    tu_to_dtype(q.data(), nq, dt, q16.data());
    tu_from_dtype(q16.data(), nq, dt, q.data());
    tu_to_dtype(q.data(), nq, FATTN_DTYPE_F32, q32.data());
    void *dq, *dout;
    float *dlse;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemcpy(dq, q16.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, nq * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    CK(cudaMemcpy(dused, pos.data(), B * 4, cudaMemcpyHostToDevice));
    fattn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.p = tu_problem(B, sn, rows, HQ, HK, d, 0, causal, NULL, NULL);
    if (ps) f.page_size = ps, f.num_pages = np, f.max_pages_per_seq = mpps;
    fattn_fwd_args fc = f, fg = f;
    fc.q = fattn_tensor_bshd(q32.data(), FATTN_DTYPE_F32), fc.o = fattn_tensor_bshd(o32.data(), FATTN_DTYPE_F32);
    fc.k = fattn_tensor_bshd(kc.data(), FATTN_DTYPE_E4M3), fc.v = fattn_tensor_bshd(vc.data(), FATTN_DTYPE_E4M3);
    fc.k.scale = ks.data(), fc.v.scale = vs.data(), fc.lse = lse32.data();
    fc.seqused_k = pos.data(), fc.block_table = ps ? table.data() : NULL;
    fg.q = fattn_tensor_bshd(dq, dt), fg.o = fattn_tensor_bshd(dout, dt);
    fg.k = fattn_tensor_bshd(dkc, FATTN_DTYPE_E4M3), fg.v = fattn_tensor_bshd(dvc, FATTN_DTYPE_E4M3);
    fg.k.scale = dks, fg.v.scale = dvs, fg.lse = dlse;
    fg.seqused_k = dused, fg.block_table = dtab;
    fc.k.scale_block = fg.k.scale_block = sbk;
    fc.v.scale_block = fg.v.scale_block = sbv;
    fattn_status s1 = fattn_fwd(g_cpu, &fc), s2 = fattn_fwd(g_gpu, &fg);
    TU_CHECK(s1 == FATTN_OK && s2 == FATTN_OK, "%s: fattn_fwd: cpu %s (%s), gpu %s (%s)", what, fattn_status_string(s1),
             fattn_last_error(g_cpu), fattn_status_string(s2), fattn_last_error(g_gpu));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o16.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    std::vector<double> got(nq), ref(nq), ref_lse(nlse);
    tu_from_dtype(o16.data(), nq, dt, got.data());
    tu_from_dtype(o32.data(), nq, FATTN_DTYPE_F32, ref.data());
    for (size_t i = 0; i < nlse; i++) ref_lse[i] = lse32[i];
    gpu_check_fwd(what, dt, got.data(), ref.data(), nq, d, glse.data(), ref_lse.data(), nlse);
    cudaFree(dq), cudaFree(dout), cudaFree(dlse), cudaFree(dkc), cudaFree(dvc), cudaFree(dks), cudaFree(dvs);
    cudaFree(dseq), cudaFree(dused), cudaFree(dtab);
}

/* what the CUDA engine refuses for FP8 caches, nothing written */
static void fp8_refusals(void) {
    uint8_t *buf;
    CK(cudaMalloc(&buf, 1 << 16));
    CK(cudaMemset(buf, 0x11, 1 << 16));
    float *sc = (float *)(buf + 32768);
    int32_t *seq = (int32_t *)(buf + 60000), *tab = seq + 4;
    CK(cudaMemset(seq, 0, 64));
    fattn_kv_append_args a;
    memset(&a, 0, sizeof a);
    a.batch = 1, a.seqlen_new = 1, a.heads_kv = 1, a.head_dim = 64;
    a.k_new = fattn_tensor_bshd(buf, FATTN_DTYPE_BF16), a.v_new = fattn_tensor_bshd(buf + 128, FATTN_DTYPE_BF16);
    a.k_cache = fattn_tensor_bshd(buf + 4096, FATTN_DTYPE_E4M3), a.v_cache = fattn_tensor_bshd(buf + 8192, FATTN_DTYPE_E4M3);
    a.k_cache.scale = sc, a.v_cache.scale = sc + 64;
    a.k_cache.scale_block = 6, a.v_cache.scale_block = 1; /* 6 does not divide the page of 16 */
    a.cache_seqlens = seq, a.block_table = tab, a.page_size = 16, a.num_pages = 2, a.max_pages_per_seq = 2;
    fattn_status st = fattn_kv_append(g_gpu, &a);
    TU_CHECK(st == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(g_gpu), "scale_block 6 with page_size 16"),
             "scale_block 6, page 16: %s: %s", fattn_status_string(st), fattn_last_error(g_gpu));
    std::vector<uint8_t> h(1 << 16);
    CK(cudaMemcpy(h.data(), buf, h.size(), cudaMemcpyDeviceToHost));
    size_t changed = 0;
    for (size_t i = 0; i < 60000; i++) changed += h[i] != 0x11;
    TU_CHECK(changed == 0, "a refused FP8 append wrote %zu bytes", changed);
    cudaFree(buf);
}

int main(void) {
    g_gpu = gpu_ctx_or_skip();
    if (fattn_ctx_create(&g_cpu, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        fprintf(stderr, "CPU context: %s\n", fattn_last_error(NULL));
        return 1;
    }
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());

    copy_cases(&rng);
    skip_cases(&rng);
    printf("appends equal to the CPU engine's bytes (or the skip rule's): %d of %d (%d with skipped rows)\n",
           g_cases_ok, g_cases, g_skip_cases);
    printf("cases by access width: 16 bytes %d, 8 bytes %d, 4 bytes %d, 2 bytes %d\n", g_width[16], g_width[8],
           g_width[4], g_width[2]);
    for (int w = 2; w <= 16; w *= 2) TU_CHECK(g_width[w] > 0, "no case takes %d-byte accesses", w);
    refusals(&rng);

    const fattn_dtype dts[] = {FATTN_DTYPE_BF16, FATTN_DTYPE_F16};
    const int pss[] = {16, 64, 0};
    for (int di = 0; di < 2; di++)
        for (int pi = 0; pi < 3; pi++)
            for (int sn = 1; sn <= 5; sn += 4)
                for (int causal = 0; causal < 2; causal++)
                    decode_step(&rng, dts[di], (di + pi + causal) % 2 ? 64 : 128, pss[pi], sn, causal);

    /* FP8 caches: scales per token, per page, per 8 rows of a page, per sequence, K and V apart */
    const int fp8_cfg[][4] = {{16, 1, 1, 64}, {16, 16, 16, 128}, {32, 8, 32, 64}, {0, 1, 1, 128}, {0, 1000, 1, 64},
                              {64, 64, 1, 256}};
    for (int ci = 0; ci < 6; ci++)
        for (int di = 0; di < 2; di++)
            fp8_case(&rng, dts[di], fp8_cfg[ci][3], fp8_cfg[ci][0], fp8_cfg[ci][1], fp8_cfg[ci][2], (ci + di) % 2);
    printf("FP8 cache appends equal to the CPU engine's codes and scales: %d of %d\n", g_fp8_ok, g_fp8_steps);
    fp8_refusals();

    fattn_ctx_free(g_gpu);
    fattn_ctx_free(g_cpu);
    return tu_finish("gpu_test_kv_append");
}
