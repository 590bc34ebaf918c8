#!/usr/bin/env python3
"""Key-block loop of each forward kernel in a SASS listing.

    cuobjdump -sass build/libfattn.so > lib.sass   (or an object file)
    python3 scripts/sass_loops.py lib.sass [--filter TEXT] [--ops]

For every function that has one, the innermost loop (a backward branch) that
holds both GEMMs of the main loop: an HGMMA with its B operand transposed (the
PV GEMM, V MN-major) and one without (the QK^T GEMM).  Prints its length in
instructions, the HGMMA, MUFU.EX2 and FSEL counts (FSEL: the masking, which
sits in a branch the unmasked blocks skip, so the executed path is shorter than
the loop), and the local-memory (spill) instructions inside the loop and in the
whole function.  --ops adds the loop's instruction mix.  Function names are the
mangled FwdCfg instances (their template arguments in order: perf-notes, and
docs/design.md for the list).  Used to check a kernel change before spending
device time on it (perf-notes v22-v29).
"""
import argparse
import collections
import re
import sys


def read_functions(path):
    funcs, cur = collections.OrderedDict(), None
    with open(path) as f:
        for line in f:
            m = re.match(r"\s+Function : (\S+)", line)
            if m:
                cur = m.group(1)
                funcs[cur] = []
                continue
            m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
            if m and cur is not None:
                funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def opcode(ins):
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def main_loop(ins):
    """(start, end, body) of the shortest backward-branch loop with both GEMMs."""
    where = {a: i for i, (a, _) in enumerate(ins)}
    best = None
    for i, (a, t) in enumerate(ins):
        m = re.search(r"\bBRA\b.*0x([0-9a-f]+)", t)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= a or target not in where:
            continue
        body = [x for _, x in ins[where[target]:i + 1]]
        # 16-bit: PV is the HGMMA with B transposed; FP8 (QGMMA, no transposes):
        # PV is the one with its A operand in registers (R, R, gdesc)
        pv = any(("HGMMA" in x and "tnspB" in x) or re.search(r"QGMMA\S* R\d+, R\d+, gdesc", x) for x in body)
        qk = any(("HGMMA" in x and "tnspB" not in x) or re.search(r"QGMMA\S* R\d+, gdesc", x) for x in body)
        if pv and qk and (best is None or len(body) < len(best[2])):
            best = (target, a, body)
    return best


def short_name(name):
    m = re.search(r"FwdCfgI(.*?)EEEv", name)
    if not m:
        return name
    args = re.findall(r"L([ib])(n?\d+)E?", m.group(1) + "E")
    return "FwdCfg<" + ", ".join(("-" + v[1:] if v.startswith("n") else v) for _, v in args) + ">"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass")
    ap.add_argument("--filter", default="", help="only functions whose mangled name contains this")
    ap.add_argument("--ops", action="store_true", help="print each loop's instruction mix")
    a = ap.parse_args()
    for name, ins in read_functions(a.sass).items():
        if a.filter not in name:
            continue
        loop = main_loop(ins)
        if loop is None:
            continue
        start, end, body = loop
        ops = collections.Counter(opcode(x) for x in body)
        spills = [addr for addr, t in ins if opcode(t).startswith(("STL", "LDL"))]
        in_loop = sum(start <= addr <= end for addr in spills)
        hgmma = sum(v for k, v in ops.items() if k.startswith(("HGMMA", "QGMMA")))
        print("%s\n  loop %x-%x: %d instructions, %d HGMMA/QGMMA, %d MUFU.EX2, %d FSEL; spill instructions %d in the loop, "
              "%d in all" % (short_name(name), start, end, len(body), hgmma, ops["MUFU.EX2"], ops["FSEL"], in_loop,
                             len(spills)))
        if a.ops:
            for op, n in ops.most_common():
                print("    %5d %s" % (n, op))
    return 0


if __name__ == "__main__":
    sys.exit(main())
