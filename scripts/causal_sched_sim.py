#!/usr/bin/env python3
"""Simulate the causal forward's tile schedule (perf-notes v41).

The kernel hands tiles out from a global counter in a fixed list order
(fwd_tile_decode: heads in groups of head_group, the last taking the rest,
longest m-block first inside a group); a CTA takes the next tile when it finishes one.  Here a tile costs
its key blocks plus a fixed per-tile cost (run 89: ~1-1.6 blocks at d128, ~3
at d256), every CTA runs at the same speed, and L2 effects are ignored, so
the result is only the load balance: the makespan against the ideal (all
work / CTAs).  It ignores power too: schedules that read more from DRAM
lost their modelled gain in clock under sustained load (v42).

    python3 scripts/causal_sched_sim.py [--ctas 132] [--tokens 16384] [--hidden 2048]
"""
import argparse
import heapq
import math

CFG = {64: (192, 128, 1.3), 128: (128, 176, 1.5), 256: (128, 80, 3.0)}  # BM, BN, per-tile cost in blocks


def head_group_rule(sk, d, nbh, nm, ctas, mode):
    """(heads per group, groups): the library's rule (fwd_sm90_launch.cuh,
    perf-notes v42: a remainder below the two-waves minimum merged into the
    last group), v15's (the remainder a group of its own) and v41's variants."""
    kv_bytes = 2.0 * sk * d * 2
    hg = int(24.0e6 / kv_bytes)
    min_hg = (2 * ctas + nm - 1) // nm
    if mode in ('rule', 'v15', 'even') and hg < min_hg:
        hg = min_hg
    if mode == 'one':
        hg = nbh
    if isinstance(mode, int):
        hg = mode
    hg = max(1, min(hg, nbh))
    if mode == 'even':
        ng = (nbh + hg - 1) // hg
        hg = (nbh + ng - 1) // ng
    ng = (nbh + hg - 1) // hg
    rem = nbh - (ng - 1) * hg
    if mode == 'rule' and ng > 1 and rem < hg and rem < min_hg:
        ng -= 1
    return hg, ng


def makespan(sq, sk, d, nbh, ctas, hg, ng):
    bm, bn, c = CFG[d]
    nm = (sq + bm - 1) // bm
    off = sk - sq
    cost = []
    for g in range(ng):
        gs = nbh - g * hg if g == ng - 1 else hg
        for m in range(nm - 1, -1, -1):
            nb = (min(sk, (m + 1) * bm + off) + bn - 1) // bn
            cost += [nb + c] * gs
    free = [0.0] * ctas
    heapq.heapify(free)
    for t in cost:
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free), sum(cost) / ctas


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--ctas', type=int, default=132)
    ap.add_argument('--tokens', type=int, default=16384)
    ap.add_argument('--hidden', type=int, default=2048)
    ap.add_argument('--seqlens', default='1024,2048,4096,6144,8192,16384')
    a = ap.parse_args()
    modes = ['rule', 'v15', 'even', 'one', 2, 3, 4, 6, 9]
    print('efficiency (ideal / makespan) per head-group choice; d, seqlen, batch x heads')
    print('%4s %6s %5s ' % ('d', 'seqlen', 'nbh') + ' '.join('%9s' % str(m) for m in modes))
    for d in (64, 128, 256):
        for s in map(int, a.seqlens.split(',')):
            b = max(1, a.tokens // s)
            nbh = b * (a.hidden // d)
            nm = (s + CFG[d][0] - 1) // CFG[d][0]
            row = []
            for mode in modes:
                hg, ng = head_group_rule(s, d, nbh, nm, a.ctas, mode)
                ms, ideal = makespan(s, s, d, nbh, a.ctas, hg, ng)
                row.append('%4.3f(%2d)' % (ideal / ms, hg))
            print('%4d %6d %5d ' % (d, s, nbh) + ' '.join(row))


if __name__ == '__main__':
    main()
