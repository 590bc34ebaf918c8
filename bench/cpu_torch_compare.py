#!/usr/bin/env python3
"""cpu_torch_compare.py - fattn's CPU forward next to PyTorch's CPU
torch.nn.functional.scaled_dot_product_attention (fp32), same shapes, same
machine, same run.

    python3 bench/cpu_torch_compare.py [--fattn build/tools/fattn] [--tokens 2048]
        [--seqlens 256,512,1024,2048] [--head-dims 64,128,256] [--causal both]
        [--iters 3] [--threads N]

fattn is measured by its own `fattn bench --backend cpu --json`, torch here in
Python; both report FLOPs = 4 * batch * heads * seqlen^2 * head_dim (halved
when causal) over the median time.  Needs torch (CPU wheel is enough).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def torch_time(torch, batch, seqlen, heads, hdim, causal, iters):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, heads, seqlen, hdim, generator=g)
    k = torch.randn(batch, heads, seqlen, hdim, generator=g)
    v = torch.randn(batch, heads, seqlen, hdim, generator=g)
    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))  # warm-up
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            ts.append((time.perf_counter() - t0) * 1e3)
    return median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fattn", default=os.path.join("build", "tools", "fattn"))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seqlens", default="256,512,1024,2048")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--causal", default="both", choices=["both", "0", "1"])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        sys.exit("cpu_torch_compare.py: torch is not installed (pip install torch)")
    torch.set_num_threads(args.threads)

    seqlens = [int(x) for x in args.seqlens.split(",")]
    hdims = [int(x) for x in args.head_dims.split(",")]
    causals = [0, 1] if args.causal == "both" else [int(args.causal)]

    def fattn_case(seqlen, hdim, causal):
        # One case per fattn process, measured right before torch's, so that
        # load from other processes hits both alike.
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "fattn.json")
            cmd = [args.fattn, "bench", "--backend", "cpu", "--dtype", "f32",
                   "--tokens", str(args.tokens), "--seqlens", str(seqlen),
                   "--head-dims", str(hdim), "--causal", str(causal),
                   "--iters", str(args.iters), "--threads", str(args.threads), "--json", out]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(out) as f:
                return json.load(f)["cases"][0]

    print(f"CPU forward, fp32, {args.tokens} tokens, hidden 2048, {args.threads} threads, "
          f"median of {args.iters}; torch {torch.__version__}")
    print()
    print("| causal | head dim | seqlen | batch | heads | fattn GFLOP/s | torch SDPA GFLOP/s | fattn / torch |")
    print("|--------|----------|--------|-------|-------|---------------|--------------------|---------------|")
    ratios = []
    for causal in causals:
        for hdim in hdims:
            for seqlen in seqlens:
                c = fattn_case(seqlen, hdim, causal)
                tms = torch_time(torch, c["batch"], c["seqlen"], c["heads"], c["head_dim"],
                                 c["causal"], args.iters)
                tg = c["flops"] / (tms * 1e-3) * 1e-9
                r = c["gflops"] / tg
                ratios.append(r)
                print(f"| {'yes' if causal else 'no':>6} | {hdim:8d} | {seqlen:6d} "
                      f"| {c['batch']:5d} | {c['heads']:5d} | {c['gflops']:13.1f} | {tg:18.1f} "
                      f"| {r:13.2f} |", flush=True)
    geo = 1.0
    for r in ratios:
        geo *= r
    print(f"\ngeometric mean fattn / torch: {geo ** (1.0 / len(ratios)):.2f}")


if __name__ == "__main__":
    main()
