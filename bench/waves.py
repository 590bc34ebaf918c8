#!/usr/bin/env python3
"""The cost of the last wave: fattn (and cuDNN, FA2 beside it) on shapes whose
tile count steps through fractional numbers of waves on the GPU's SMs.

    python3 bench/waves.py [--head-dims 128,256,64] [--dtype bf16] [--json out.json]

Batch 1, seqlen 4224 (33 query blocks of 128 rows, 22 of 192), non-causal; the
number of heads moves the tile count from 14 to 16 waves of 132 CTAs in
quarter (d64: half) waves.  With a perfect tail, TFLOPs/s would be flat across
the heads; a last wave that keeps only part of the SMs busy shows as a dip at
fractional wave counts (perf-notes: the last-wave item).  Timing as
bench/compare.py (interleaved backends, settled clocks, CUDA events).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import fattn  # noqa: E402  (compare put python/ on the path)

SEQ = 4224
# head dim -> (query rows per tile of fattn's non-causal kernel, heads list)
PLAN = {128: (128, list(range(56, 65))), 256: (128, list(range(56, 65))), 64: (192, list(range(84, 97, 3)))}


def main():
    a, dt = compare.small_bench_args(__doc__, lambda ap: ap.add_argument("--head-dims", default="128,256,64"))
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    print("device: %s, %d SMs, seqlen %d, batch 1, non-causal, %s" % (torch.cuda.get_device_name(), sms, SEQ, a.dtype))
    print("%4s %5s %7s | %7s %7s %7s | %8s" % ("d", "heads", "waves", "fattn", "cuDNN", "FA2", "x cuDNN"))
    for d in [int(x) for x in a.head_dims.split(",")]:
        bm, heads = PLAN[d]
        for h in heads:
            tiles = h * ((SEQ + bm - 1) // bm)
            r = compare.bench_case(ctx, dt, 1, SEQ, h, d, False, a.iters, rounds=2, settle_ms=a.settle_ms)
            r["waves"] = tiles / sms
            out.append(r)
            print("%4d %5d %7.2f | %7.1f %7.1f %7.1f | %8.3f" % (d, h, r["waves"], r["fattn"], r["cudnn"] or 0,
                                                                 r["fa2"] or 0, r["fattn"] / r["cudnn"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
