#!/usr/bin/env python3
"""Memory traffic of one forward call per backend (fattn, cuDNN and FA2 SDPA), for
reading under Nsight Compute: each backend runs its call twice, on the same inputs
as bench/compare.py draws them (16k tokens, hidden 2048).

    ncu --clock-control none --metrics dram__bytes_read.sum,lts__t_bytes.sum,... \\
        --csv python3 bench/traffic.py [--shapes d:causal:seqlen,...] [--dtype bf16]

The kernels of a backend's calls come after its line "== <backend> <shape>" on stdout;
ncu's CSV gives each kernel's counters (perf-notes, v18).
"""
import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (torch, fattn, Case)
import torch  # noqa: E402
from torch.nn.attention import sdpa_kernel  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="256:1:2048,128:1:1024,128:1:4096,64:1:2048,256:0:4096,128:0:1024,128:0:16384",
                    help="head_dim:causal:seqlen, comma-separated")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--calls", type=int, default=2)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    ctx = compare.fattn.Context(compare.fattn.BACKEND_CUDA, 0)
    for spec in a.shapes.split(","):
        d, causal, s = (int(x) for x in spec.split(":"))
        b, h = 16384 // s, 2048 // d
        case = compare.Case(ctx, dtype, b, s, h, d, bool(causal), 1234 + s + d)
        shape = f"d{d} {'causal' if causal else 'non-causal'} seqlen {s} batch {b} heads {h}"
        torch.cuda.synchronize()
        for name, fn, be in case.calls:
            print(f"== {name} {shape}", flush=True)
            with contextlib.nullcontext() if be is None else sdpa_kernel([be]):
                for _ in range(a.calls):
                    fn()
                    torch.cuda.synchronize()
        del case


if __name__ == "__main__":
    main()
