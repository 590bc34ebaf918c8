/* bwd_scheduler.cuh - which work a backward CTA does: its key block, kv head
 * and batch entry (the grid's order: plain, or longest-first in L2-sized
 * head groups for causal), the iterations of its key block, the host's grid,
 * and in deterministic mode the turn at which a key block adds its dQ. */
#pragma once
#include "fattn.h"
#include "bwd_traits.cuh"

/* The iterations of key block n: the query heads of the group (outer) and
 * the query blocks from the first that sees a key of the block (inner). */
template <class C>
struct BwdIter {
    int m_start, m_count, total;
    __device__ __forceinline__ BwdIter(const BwdParams &p, int n) {
        m_start = 0;
        int m_end = p.m_blocks;
        if (C::CAUSAL) {
            /* query row i sees key j iff j <= i + causal_offset */
            const int first_q = n * C::BN - p.causal_offset;
            m_start = first_q <= 0 ? 0 : first_q / C::BM;
        }
        if (C::LOCAL) {
            /* the query blocks with a row that sees a key of the block: the
             * last row reaches its first key, the first row its last key */
            if (p.win_right >= 0) {
                const int first_q = n * C::BN - p.causal_offset - p.win_right;
                m_start = first_q <= 0 ? 0 : first_q / C::BM;
            }
            if (p.win_left >= 0) {
                const int last_q = n * C::BN + C::BN - 1 - p.causal_offset + p.win_left;
                m_end = last_q < 0 ? 0 : min(m_end, last_q / C::BM + 1);
            }
        }
        m_count = m_end > m_start ? m_end - m_start : 0;
        total = p.group * m_count;
    }
    __device__ __forceinline__ void decode(int it, int hk, const BwdParams &p, int &h, int &m) const {
        const int g = it / m_count;
        m = m_start + (it - g * m_count);
        h = hk * p.group + g;
    }
};

/* This CTA's key block n, kv head hk and batch entry b.  The 3-D grid is (n,
 * hk, b); LPT's 1-D grid takes groups of lpt_group (kv head, batch) pairs,
 * the key block the slowest index inside a group, so the longest CTAs (n = 0
 * sees every query block) start first and a group's CTAs share its Q and dO
 * in L2; SPT (deterministic causal) runs the key blocks the other way. */
template <class C>
__device__ __forceinline__ void bwd_tile_coords(const BwdParams &p, int &n, int &hk, int &b) {
    n = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    if (C::LPT && p.lpt_group > 0) {
        const int nblk = (p.seqlen_k + C::BN - 1) / C::BN, pairs = p.heads_kv * p.batch;
        const int per_group = p.lpt_group * nblk, g = blockIdx.x / per_group, r = blockIdx.x - g * per_group;
        const int gsize = min(p.lpt_group, pairs - g * p.lpt_group), hb = g * p.lpt_group + r % gsize;
        n = r / gsize, hk = hb % p.heads_kv, b = hb / p.heads_kv;
        if (p.spt) n = nblk - 1 - n;
    }
}

/* Deterministic mode: the count of key blocks that must have added query
 * block m's dQ before key block n does.  Key blocks add in order 0 .. n - 1
 * (every block before n sees query block m if n does); SPT: from the last
 * block that sees query block m down to n + 1, which started before this CTA
 * (the shortest-first grid). */
template <class C>
__device__ __forceinline__ int bwd_dq_turn(const BwdParams &p, int n, int m) {
    if (C::LOCAL && p.win_left >= 0) {
        /* LOCAL (3-D grid, no SPT): the key blocks from the first that sees
         * query block m */
        const int first_k = m * C::BM + p.causal_offset - p.win_left;
        return n - (first_k <= 0 ? 0 : first_k / C::BN);
    }
    if (!p.spt) return n;
    const int last = (m * C::BM + C::BM - 1 + p.causal_offset) / C::BN, nblk = (p.seqlen_k + C::BN - 1) / C::BN;
    return min(last, nblk - 1) - n;
}

/* The main kernel's grid for problem pr (VARLEN: over the longest
 * sequence), and p's LPT fields. */
template <class C>
dim3 bwd_grid(const fattn_problem *pr, BwdParams &p) {
    const unsigned nblk = (unsigned)((pr->seqlen_k + C::BN - 1) / C::BN);
    dim3 grid(nblk, (unsigned)pr->heads_kv, (unsigned)pr->batch);
    if (C::LPT && (uint64_t)nblk * pr->heads_kv * pr->batch <= 0x7FFFFFFFu) {
        /* as many kv heads a group as keep their Q, dO (16-bit) and dQ
         * accumulator (fp32) within 32 MiB of the 60 MB L2 */
        const double head_bytes =
            (double)pr->seqlen_q * (2.0 * C::HD + 2.0 * C::HDV + 4.0 * C::D) * (pr->heads_q / pr->heads_kv);
        const double g = (32.0 * 1024 * 1024) / (head_bytes > 1.0 ? head_bytes : 1.0);
        p.lpt_group = g < 1.0 ? 1 : g > (double)pr->heads_kv * pr->batch ? pr->heads_kv * pr->batch : (int)g;
        grid = dim3(nblk * (unsigned)pr->heads_kv * (unsigned)pr->batch, 1, 1);
        p.spt = C::CAUSAL && p.deterministic;
    }
    return grid;
}
