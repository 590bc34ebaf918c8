"""Summarise bench/fwd_trace output: where a CTA's time goes per tile.

Events (thread 0 of a warpgroup, FWD_TRACE in src/cuda/hopper/fwd/fwd_mainloop.cuh
and fwd_producer.cuh): consumer 1 tile start (Q and index), 2 data ready,
3/4/8 slot start (holds the pingpong token: QK only / QK+PV / PV only), 5 S
ready, 6 softmax done, 7 PV done; producer 20 tile, 21 K stage free, 22 Q
issued, 23 V stage free.  (9, epilogue done, is not recorded since the
epilogue became FwdEpilogue, which has no trace_n.)
"""
import sys
from collections import defaultdict
from statistics import median

def runs(path):
    name, ev = None, []
    for line in open(path):
        if line.startswith('#'):
            if name: yield name, ev
            name, ev = line[2:].split(' err=')[0], []
        else:
            w, c, e = map(int, line.split())
            ev.append((w, c, e))
    if name: yield name, ev

for name, ev in runs(sys.argv[1]):
    wgs = sorted({w for w, _, _ in ev if w > 0})
    t0 = min(c for _, c, _ in ev)
    t1 = max(c for _, c, _ in ev)
    slots = sorted((c, w, e) for w, c, e in ev if e in (3, 4, 8))
    gaps = defaultdict(list)   # interval from one slot start to the next, keyed by (this kind -> next kind)
    for (ca, wa, ea), (cb, wb, eb) in zip(slots, slots[1:]):
        gaps[(ea, eb)].append(cb - ca)
    kind = {3: 'QK', 4: 'QK+PV', 8: 'PV'}
    ntiles = sum(1 for w, _, e in ev if w > 0 and e == 1) - len(wgs)   # minus the sentinel
    print(f'== {name}: {t1 - t0} cycles, {ntiles / len(wgs):.0f} tiles per warpgroup, '
          f'{(t1 - t0) * len(wgs) / max(ntiles, 1):.0f} cycles per tile')
    total = 0
    for k, v in sorted(gaps.items(), key=lambda kv: -sum(kv[1])):
        total += sum(v)
        print(f'  slot {kind[k[0]]:>6} -> {kind[k[1]]:<6} n={len(v):5d} median {median(v):6.0f}  sum {sum(v):9d}')
    # per warpgroup phases
    for w in wgs:
        e = [(c, x) for ww, c, x in ev if ww == w]
        d = defaultdict(list)
        for (ca, xa), (cb, xb) in zip(e, e[1:]):
            d[(xa, xb)].append(cb - ca)
        top = sorted(d.items(), key=lambda kv: -sum(kv[1]))[:9]
        print(f'  wg{w}: ' + '; '.join(f'{a}->{b} n{len(v)} med {median(v):.0f} sum {sum(v)}' for (a, b), v in top))
