/* fwd_gather.cuh - KVCACHE on a page pool whose pages TMA cannot load:
 * page sizes whose gcd with the key block is not a multiple of the 8-row
 * swizzle atom (1, 2, 4, odd sizes, ...; page_div.h's fattn_page_box 0).
 * Warps 1-3 of the producer warpgroup (idle in the 16-bit kernels) gather
 * each key block's K and V rows with cp.async, 16 bytes a copy, into the
 * 128-byte swizzled layout TMA would write (row r of a 64-column slab at
 * slab + r * 128, its 16-byte chunk c at (c ^ r % 8) * 16), rows past the
 * sequence's used keys, pages outside the pool and head-dim columns past D
 * (d96, d192's slabs) as zeros (src-size 0: nothing read), as TMA's bounds
 * give zeros.
 *
 * Protocol, per ring position it (stage s = it % STAGES, parity ph):
 *   producer thread   waits empty_k[s] (parity ph ^ 1), writes the job
 *                     (sequence b, kv head, first key, keys used) into
 *                     job_slot[s] and arrives on job[s] (count 1, release);
 *                     it does not touch full_k, full_v or empty_v.
 *   gather threads    wait job[s] (ph), read the job, fence.proxy.async (the
 *   (96)              consumers' wgmma reads of the stage, async proxy, are
 *                     ordered before these generic-proxy writes), issue K's
 *                     copies, cp.async.mbarrier.arrive.noinc on full_k[s];
 *                     then wait empty_v[s] (ph ^ 1) themselves, fence, V's
 *                     copies, arrive.noinc on full_v[s].
 *   consumers         wait full_k / full_v as with TMA, then (kv_box 0 only)
 *                     fence.proxy.async.shared::cta before their wgmma: the
 *                     copies are generic-proxy writes, which the async proxy
 *                     sees only across a proxy fence on the path from the
 *                     write to the read (here after the acquiring wait).
 * full_k and full_v are initialised with count 96 (the .noinc arrivals, one
 * per gather thread, each made when that thread's copies have landed) and no
 * transaction bytes, so a phase completes when every copy of the stage has
 * landed, as TMA's complete_tx completes it.  job[s] cannot run a phase
 * ahead of a gather thread: the producer posts position it + STAGES only
 * after empty_k[s], which needs full_k of position it, which needs every
 * gather thread's arrival there.  The end: the producer posts a job with
 * b = -1 at the position after its last block (after empty_k, so that the
 * slot is free); the gather threads wait for their copies and leave. */
#pragma once
#include "fwd_pipeline.cuh"

constexpr int FWD_GATHER_THREADS = 96; /* warps 1-3 of the producer warpgroup */

template <class C>
struct FwdGather {
    const FwdSmem<C> &sm;
    const FwdVarlen &vl;
    const FwdPaged &pg;
    int t; /* 0 .. FWD_GATHER_THREADS - 1 */

    /* One key block of a stage: SL slabs of 64 columns, the first COLS of
     * each row from the pool (the rest zeros).  Thread t copies 16-byte
     * chunk t % (8 SL) of rows t / (8 SL), + 96 / (8 SL), ...: a row's chunks
     * are consecutive threads (one 128..512-byte read), and each thread looks
     * up its rows' pages (the row's threads the same table word). */
    template <int SL, int COLS>
    __device__ __forceinline__ void gather(uint8_t *dst, const uint8_t *pool, int64_t s_page, int64_t s_row,
                                           int64_t s_head, int4 job) const {
        constexpr int CH = SL * 8, RP = FWD_GATHER_THREADS / CH;
        static_assert(FWD_GATHER_THREADS % CH == 0, "a pass covers whole rows");
        const int g = t % CH, ch = g & 7;
        const uint32_t base = smem_u32(dst) + (g >> 3) * C::BN * 128;
        const uint8_t *col = pool + job.y * s_head + g * 16; /* kv head job.y, chunk g */
        const int *table = vl.block_table + job.x * vl.max_pages;
#pragma unroll 2
        for (int r = t / CH; r < C::BN; r += RP) {
            const int key = job.z + r;
            const uint8_t *src = pool;
            bool ok = false;
            if (key < job.w && g < COLS * 2 / 16) {
                const int j = fattn_page_div(key, vl.page_mul, vl.page_shr);
                const int page = __ldg(table + j);
                ok = (unsigned)page < (unsigned)pg.num_pages; /* else zeros, as TMA's bounds */
                src = col + page * s_page + (key - j * vl.page_size) * s_row;
            }
            cp_async_16(base + r * 128 + ((ch ^ (r & 7)) << 4), ok ? src : pool, ok);
        }
    }

    /* KV8 (an FP8 cache, fattn.h): the same layout, each 16-byte chunk from
     * 8 e4m3 codes (8 bytes at byte column 8 g) times the row's scale, in the
     * kernel's 16-bit type, by plain loads and st.shared (the stage's full
     * barrier then takes a plain arrival).  The row's scale: entry e (a page,
     * or the dense cache's batch entry) and row r in it, at sc[e s_entry +
     * kv head s_head + (nb == 1 ? 0 : r / sblock)].  A dense cache (no
     * block table): entry cache_batch_idx[b] or b, row = key. */
    template <int SL>
    __device__ __forceinline__ void gather8(uint8_t *dst, const uint8_t *pool, int64_t s_page, int64_t s_row,
                                            int64_t s_head, const float *sc, const FwdKv8Scale &sl, int4 job) const {
        constexpr int CH = SL * 8, RP = FWD_GATHER_THREADS / CH;
        static_assert(FWD_GATHER_THREADS % CH == 0, "a pass covers whole rows");
        const int g = t % CH, ch = g & 7;
        const uint32_t base = smem_u32(dst) + (g >> 3) * C::BN * 128;
        const uint8_t *col = pool + job.y * s_head + g * 8;
        const float *sch = sc + (int64_t)job.y * sl.s_head;
        const int *table = vl.block_table ? vl.block_table + job.x * vl.max_pages : nullptr;
        const int dense_entry = vl.cache_batch_idx ? __ldg(vl.cache_batch_idx + job.x) : job.x;
#pragma unroll 4
        for (int r = t / CH; r < C::BN; r += RP) {
            const int key = job.z + r;
            uint2 w = make_uint2(0, 0);
            float scale = 0.f;
            if (key < job.w) {
                int entry = dense_entry, row = key;
                if (table) {
                    const int j = fattn_page_div(key, vl.page_mul, vl.page_shr);
                    entry = __ldg(table + j);
                    row = key - j * vl.page_size;
                }
                if ((unsigned)entry < (unsigned)pg.num_pages) { /* else zeros, as TMA's bounds */
                    w = __ldg((const uint2 *)(col + entry * s_page + row * s_row));
                    scale = __ldg(sch + entry * sl.s_entry + (sl.nb == 1 ? 0 : row / sl.sblock));
                }
            }
            st_shared_v4(base + r * 128 + ((ch ^ (r & 7)) << 4), kv8_dequant8<C::BF16>(w, scale));
        }
    }

    /* K (V false) or V of the job into stage s, then the stage's full
     * barrier: cp.async's arrival when its copies land, KV8's plain one */
    template <bool V>
    __device__ __forceinline__ void fill(int s, int4 job) const {
        constexpr int SL = V ? C::V_SLABS : C::SLABS, COLS = V ? C::DV : C::D;
        uint8_t *dst = V ? sm.v_stage(s) : sm.k_stage(s);
        uint64_t *full = V ? &sm.full_v[s] : &sm.full_k[s];
        const uint8_t *pool = V ? pg.v : pg.k;
        const int64_t s_page = V ? pg.v_page : pg.k_page, s_row = V ? pg.v_row : pg.k_row;
        const int64_t s_head = V ? pg.v_head : pg.k_head;
        if constexpr (C::KV8) {
            gather8<SL>(dst, pool, s_page, s_row, s_head, V ? pg.v_scale : pg.k_scale, V ? pg.vs : pg.ks, job);
            mbar_arrive(full);
        } else {
            gather<SL, COLS>(dst, pool, s_page, s_row, s_head, job);
            cp_async_mbar_arrive_noinc(full);
        }
    }

    __device__ __forceinline__ void run() const {
        for (int it = 0;; ++it) {
            const int s = ring_stage(it, C::STAGES);
            const uint32_t ph = ring_phase(it, C::STAGES);
            mbar_wait<true>(&sm.job[s], ph); /* sleeping: the consumers keep the issue slots */
            const int4 job = ld_shared_s32x4(sm.job_slot + 4 * s);
            if (job.x < 0) break;
            fence_async_shared();
            fill<false>(s, job);
            mbar_wait<true>(&sm.empty_v[s], ph ^ 1);
            fence_async_shared();
            fill<true>(s, job);
        }
        if constexpr (!C::KV8) cp_async_wait_all();
    }
};
