#!/usr/bin/env python3
"""Check the Hopper kernels' main loops in a SASS listing for what the design needs.

    cuobjdump -sass build/libfattn.so > lib.sass   (or an object file)
    python3 scripts/sass_check.py lib.sass [--fwd]

Backward (bwd_sm90_kernel), every instance, in its consumer loop (sass_loops.main_loop):
  - no generic loads or stores (LD / ST: a shared-memory access through a generic pointer,
    which costs a long-scoreboard wait; LSE, D and the dQ staging go through LDS / STS);
  - head dims 64 and 128: every exponential (MUFU.EX2) of P^T sits between the S^T wait and
    the dP^T wait (the first two WARPGROUP.DEPBARs after the loop's first HGMMA), so that
    dP^T runs under them; ptxas has hoisted that wait before (perf-gap 2.2, perf-notes b9).
Forward (FwdCfg kernels): the same two rules are printed for the key-block loop (the PV wait
below the softmax's exponentials is the intra-warpgroup overlap); with --fwd they also fail.
Exit status 1 when a checked rule fails, 2 when the listing has no backward kernel.
"""
import argparse
import re
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sass_loops import main_loop, opcode, read_functions, short_name  # noqa: E402


def generic_mem(body):
    """The loop's generic loads and stores (not LDS/STS/LDG/STG/LDSM/STSM/LDL/STL)."""
    return [x for x in body if opcode(x) in ("LD", "ST") or opcode(x).startswith(("LD.", "ST."))]


def exps_between_waits(body):
    """(EX2s before the first wait, between the first two waits, total) from the loop's first HGMMA on."""
    first = next((i for i, x in enumerate(body) if opcode(x).startswith("HGMMA")), None)
    if first is None:
        return None
    waits = [i for i in range(first, len(body)) if opcode(body[i]).startswith("WARPGROUP.DEPBAR")]
    if len(waits) < 2:
        return None
    ex = [i for i, x in enumerate(body) if "MUFU.EX2" in x]
    return (sum(i < waits[0] for i in ex), sum(waits[0] < i < waits[1] for i in ex), len(ex))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass")
    ap.add_argument("--fwd", action="store_true", help="let the forward kernels' rules fail the check too")
    a = ap.parse_args()
    failed, nbwd = 0, 0
    for name, ins in read_functions(a.sass).items():
        bwd = "bwd_sm90_kernel" in name
        if not bwd and "FwdCfg" not in name:
            continue
        loop = main_loop(ins)
        if loop is None:
            continue
        start, end, body = loop
        gen = generic_mem(body)
        ew = exps_between_waits(body)
        problems = []
        if gen:
            problems.append("%d generic loads/stores (%s)" % (len(gen), ", ".join(sorted(set(opcode(x) for x in gen)))))
        m = re.search(r"BwdOptsLi(\d+)E", name)
        overlap_rule = (m and int(m.group(1)) in (64, 128)) if bwd else True
        if overlap_rule:
            if ew is None:
                problems.append("no S and PV/dP waits found")
            elif ew[1] < ew[2]:
                problems.append("second wait before %d of %d exponentials" % (ew[2] - ew[1], ew[2]))
        if bwd:
            o = re.findall(r"L([ib])(n?\d+)E", re.search(r"BwdOpts(L.*?)EEEE", name).group(1) + "E")
            label = "BwdOpts<%s>" % ", ".join(("-" + v[1:] if v.startswith("n") else v) for _, v in o)
        else:
            label = short_name(name)
        counts = problems and (bwd or a.fwd)
        nbwd += bwd
        print("%-5s %s\n      loop %x-%x, %d instructions%s" % ("FAIL" if counts else "ok" if not problems else "note",
                                                             label, start, end, len(body),
                                                             ": " + "; ".join(problems) if problems else ""))
        failed |= bool(counts)
    if nbwd == 0:
        print("no backward kernel in %s" % a.sass)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
