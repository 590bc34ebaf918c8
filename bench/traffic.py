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
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fattn  # noqa: E402

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="256:1:2048,128:1:1024,128:1:4096,64:1:2048,256:0:4096,128:0:1024,128:0:16384",
                    help="head_dim:causal:seqlen, comma-separated")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--calls", type=int, default=2)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    for spec in a.shapes.split(","):
        d, causal, s = (int(x) for x in spec.split(":"))
        b, h = 16384 // s, 2048 // d
        g = torch.Generator(device="cuda").manual_seed(1234 + s + d)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        ctx.set_stream(torch.cuda.current_stream().cuda_stream)
        args = ctx.fwd_args(q, k, v, o, lse, bool(causal))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        shape = f"d{d} {'causal' if causal else 'non-causal'} seqlen {s} batch {b} heads {h}"
        torch.cuda.synchronize()
        for name, be in (("fattn", None), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            print(f"== {name} {shape}", flush=True)
            for _ in range(a.calls):
                if be is None:
                    ctx.fwd_raw(args)
                else:
                    with sdpa_kernel([be]):
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                torch.cuda.synchronize()
        del q, k, v, o, lse, qt, kt, vt


if __name__ == "__main__":
    main()
