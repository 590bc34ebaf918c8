#!/usr/bin/env python3
"""cpu_torch_compare.py - fattn's CPU forward next to PyTorch's CPU
torch.nn.functional.scaled_dot_product_attention (fp32), same shapes, same
process, interleaved.

    python3 bench/cpu_torch_compare.py [--lib build/libfattn.so] [--tokens 2048]
        [--seqlens 256,512,1024,2048] [--head-dims 64,128,256] [--causal both]
        [--rounds 7] [--threads N] [--isa avx2] [--bwd] [--json FILE]

Per shape, fattn (through ctypes, python/fattn) and torch take turns for
--rounds rounds, each round starting with the other backend than the last,
one call per turn after one warm-up call each; the table has each backend's
median.  Both see the same numbers: fattn in its [batch, seqlen, heads, dim]
layout, torch in its [batch, heads, seqlen, dim] (each contiguous), and the
outputs are compared.  FLOPs = 4 * batch * heads * seqlen^2 * head_dim (halved
when causal).  --bwd times the backward instead: fattn_bwd on the forward's O
and LSE against torch.autograd.grad through SDPA's graph (its CPU flash
backward), dO ~ N(0, 1), FLOPs 2.5x the forward's.  Interleaving matters on a shared machine: load from other
processes then hits both backends alike.  Needs torch (the CPU wheel is
enough).
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next(l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name"))
        flags = next(l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags"))
        isa = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "baseline"
        return "%s (%d logical CPUs, %s)" % (name, os.cpu_count(), isa)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.environ.get("FATTN_LIBRARY",
                                                    os.path.join(HERE, "..", "build", "libfattn.so")))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--seqlens", default="256,512,1024,2048")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--causal", default="both", choices=["both", "0", "1"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--isa", help="fattn's forward instance (FATTN_CPU_ISA: scalar, generic, avx2, "
                                  "avx2w16, avx512); default: the best this CPU runs")
    ap.add_argument("--bwd", action="store_true", help="time the backward (dQ, dK, dV) instead")
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        sys.exit("cpu_torch_compare.py: torch is not installed (pip install torch)")
    os.environ["FATTN_LIBRARY"] = os.path.abspath(args.lib)
    if args.isa:
        os.environ["FATTN_CPU_ISA"] = args.isa
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import fattn
    if args.bwd:
        sys.path.insert(0, HERE)
        from compare import bwd_args

    torch.set_num_threads(args.threads)
    ctx = fattn.Context(fattn.BACKEND_CPU)
    fattn._lib.fattn_ctx_set_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    ctx._check(fattn._lib.fattn_ctx_set_threads(ctx._h, args.threads))
    F = torch.nn.functional

    seqlens = [int(x) for x in args.seqlens.split(",")]
    hdims = [int(x) for x in args.head_dims.split(",")]
    causals = [0, 1] if args.causal == "both" else [int(args.causal)]

    print("CPU %s, fp32: %s; %d threads each; %d tokens, hidden %d; fattn %s (%s), "
          "torch %s; median of %d interleaved rounds"
          % ("backward" if args.bwd else "forward", cpu_model(), args.threads, args.tokens, args.hidden, fattn.__version__,
             os.path.basename(args.lib), torch.__version__, args.rounds))
    if os.environ.get("FATTN_CPU_ISA"):
        print("FATTN_CPU_ISA=%s" % os.environ["FATTN_CPU_ISA"])
    print()
    print("| causal | head dim | seqlen | batch | heads | fattn GFLOP/s | torch SDPA GFLOP/s | fattn / torch |")
    print("|--------|----------|--------|-------|-------|---------------|--------------------|---------------|")
    rows = []
    g = torch.Generator().manual_seed(1)
    for causal in causals:
        for hdim in hdims:
            for seqlen in seqlens:
                batch, heads = args.tokens // seqlen, args.hidden // hdim
                shape = (batch, seqlen, heads, hdim)
                q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
                o = torch.empty(shape)
                tq, tk, tv = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                lse = torch.empty(batch, heads, seqlen)
                fa = ctx.fwd_args(q, k, v, o, lse, causal=bool(causal))

                if args.bwd:
                    ctx.fwd_raw(fa)
                    dout = torch.randn(shape, generator=g)
                    dq, dk, dv = (torch.empty(shape) for _ in range(3))
                    ba = bwd_args(q, k, v, o, dout, dq, dk, dv, lse, bool(causal))
                    gq, gk, gv = (x.detach().requires_grad_() for x in (tq, tk, tv))
                    to = F.scaled_dot_product_attention(gq, gk, gv, is_causal=bool(causal))
                    tdo = dout.transpose(1, 2).contiguous()

                    def run_fattn():
                        ctx.bwd_raw(ba)

                    def run_torch():
                        return torch.autograd.grad(to, (gq, gk, gv), tdo, retain_graph=True)
                else:
                    def run_fattn():
                        ctx.fwd_raw(fa)

                    def run_torch():
                        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=bool(causal))

                with torch.no_grad() if not args.bwd else contextlib.nullcontext():
                    run_fattn()
                    ref = run_torch()
                    if args.bwd:
                        err = max((a - b.transpose(1, 2)).abs().max().item() for a, b in zip((dq, dk, dv), ref))
                    else:
                        err = (o - ref.transpose(1, 2)).abs().max().item()
                    times = {"fattn": [], "torch": []}
                    for r in range(args.rounds):
                        order = (("fattn", run_fattn), ("torch", run_torch))
                        for name, fn in (order if r % 2 == 0 else order[::-1]):
                            t0 = time.perf_counter()
                            fn()
                            times[name].append(time.perf_counter() - t0)
                flops = 4.0 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
                flops *= 2.5 if args.bwd else 1.0
                fg = flops / median(times["fattn"]) * 1e-9
                tg = flops / median(times["torch"]) * 1e-9
                rows.append({"causal": causal, "head_dim": hdim, "seqlen": seqlen, "batch": batch,
                             "heads": heads, "fattn_gflops": fg, "torch_gflops": tg,
                             "ratio": fg / tg, "max_abs_diff": err})
                print("| %6s | %8d | %6d | %5d | %5d | %13.1f | %18.1f | %13.2f |"
                      % ("yes" if causal else "no", hdim, seqlen, batch, heads, fg, tg, fg / tg),
                      flush=True)
                if not err < 1e-3:
                    print("  fattn and torch differ: max |diff| %.3e" % err, flush=True)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print("\ngeometric mean fattn / torch: %.2f" % geo)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pass": "backward" if args.bwd else "forward", "cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                       "rounds": args.rounds, "rows": rows, "geomean": geo}, f, indent=1)


if __name__ == "__main__":
    main()
