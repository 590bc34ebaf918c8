#!/usr/bin/env python3
"""Compare the forward kernels of two SASS listings, kernel by kernel.

    cuobjdump -sass old/libfattn.a > old.sass; cuobjdump -sass new/libfattn.a > new.sass
    python3 scripts/sass_compare.py old.sass new.sass

Kernels are matched by their options (FwdCfg's positional parameters before
issue 22, FwdOpts after: both are mapped to the same key), so a refactor that
renames the configuration can be checked for identical code.  Per kernel it
prints the instruction counts, the key-block loop's length (sass_loops.py's
rule), local-memory instructions, and whether the instruction text matches
once addresses are stripped.
"""
import collections
import re
import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sass_loops import read_functions, main_loop  # noqa: E402

OLD = "D BN NC STAGES CAUSAL BF16 OVERLAP PINGPONG SCHED LAZY CLUSTER OSTORE XTILE QEARLY SLEEP L2HINT ROWMASK TREEMAX SITOUT SPREAD SKIPDIAG QREG SPLIT UNIWG OTMA".split()
# FwdOpts's fields in their order (fwd_traits.cuh); a listing from before a
# field existed gets 0 for it and for the fields after it (so compare
# listings of the same FwdOpts)
NEW = ("d bn dv nc stages causal bf16 overlap pingpong cluster qearly sleep sitout spread skipdiag qreg split otma "
       "fp8 kcol kvblk preg varlen local kvcache").split()
KEY = NEW


def val(x):
    return {"true": 1, "false": 0}.get(x, None) if x in ("true", "false") else int(x)


def key_of(mangled):
    dem = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    entry = dem.split("<", 1)[0].split()[-1]
    m = re.search(r"FwdOpts\{([^}]*)\}", dem)
    if m:
        vals = dict.fromkeys(NEW, 0)  # options added later (fp8, kcol) default to 0
        vals.update(zip(NEW, [val(v.strip()) for v in m.group(1).split(",")]))
    else:
        m = re.search(r"FwdCfg<([^>]*)>", dem)
        if not m:
            return None
        o = dict(zip(OLD, [val(v.strip()) for v in m.group(1).split(",")]))
        vals = {"d": o["D"], "bn": o["BN"], "nc": o["NC"], "stages": o["STAGES"], "causal": o["CAUSAL"],
                "bf16": o["BF16"], "overlap": o["OVERLAP"], "pingpong": o["PINGPONG"], "cluster": o["CLUSTER"],
                "qearly": o["QEARLY"], "sleep": o["SLEEP"], "sitout": o["SITOUT"], "spread": o["SPREAD"],
                "skipdiag": o["SKIPDIAG"], "qreg": o["QREG"], "split": o["SPLIT"], "otma": o["OTMA"]}
        vals = dict(dict.fromkeys(NEW, 0), **vals)
    return (entry,) + tuple(vals[k] for k in KEY)


def norm(body):
    return [re.sub(r"0x[0-9a-f]+", "X", t) if "BRA" in t or "CALL" in t else t for t in body]


def load(path):
    res = {}
    for name, ins in read_functions(path).items():
        k = key_of(name)
        if k is None:
            continue
        body = [t for _, t in ins]
        loop = main_loop(ins)
        local = sum(1 for t in body if re.search(r"\b(LDL|STL)", t))
        res[k] = (len(body), len(loop[2]) if loop else "-", local, norm(body))
    return res


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    same = 0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print("only in", "old" if k in a else "new", k)
            continue
        (na, la, sa, ta), (nb, lb, sb, tb) = a[k], b[k]
        ident = ta == tb
        same += ident
        ops_a = collections.Counter(t.split()[0] for t in ta)
        ops_b = collections.Counter(t.split()[0] for t in tb)
        tag = "identical" if ident else ("same opcodes" if ops_a == ops_b else "differs")
        print("%-16s %s  instr %5d -> %5d  loop %4s -> %4s  local %2d -> %2d  %s" %
              (k[0], ",".join(str(x) for x in k[1:]), na, nb, la, lb, sa, sb, tag))
    print("%d of %d kernels identical" % (same, len(set(a) & set(b))))


if __name__ == "__main__":
    main()
