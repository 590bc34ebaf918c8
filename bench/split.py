#!/usr/bin/env python3
"""Few query tiles, long keys: fattn with its tiles split along the keys
(FwdCfg SPLIT, the default) and with FATTN_OPTION_DISABLE_SPLIT, next to cuDNN
and FA2 in the same process (perf-notes v30).

    python3 bench/split.py [--dtype bf16] [--json out.json]

Shapes (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), non-causal:
a long prompt's last chunk against its whole context, and single-query
decoding steps, where fewer tiles than SMs leave most of the GPU idle unless
the keys are split.  FLOPs = 4 b h s_q s_k d; TFLOPs/s from the median of
CUDA-event samples, the backends taking turns over 3 rounds, each running
for --settle-ms first (bench/compare.py's timing).
"""
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import fattn  # noqa: E402  (compare put python/ on the path)
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = [
    (1, 512, 32768, 16, 16, 128),
    (1, 1024, 16384, 8, 8, 128),
    (2, 256, 65536, 8, 2, 128),
    (1, 512, 32768, 8, 8, 256),
    (1, 768, 32768, 32, 32, 64),
    (1, 1, 32768, 32, 8, 128),
    (4, 1, 16384, 32, 32, 64),
]


def main():
    a, dt = compare.small_bench_args(__doc__)
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    ctx.set_stream(torch.cuda.current_stream().cuda_stream)
    print("device: %s, %s, non-causal; TFLOPs/s (split / unsplit / cuDNN / FA2)" % (torch.cuda.get_device_name(),
                                                                                 a.dtype))
    print("%2s %5s %6s %4s %4s %4s | %7s %7s %7s %7s | %8s %8s" % ("b", "s_q", "s_k", "hq", "hkv", "d", "split",
                                                                   "unsplit", "cuDNN", "FA2", "x unspl", "x cuDNN"))
    out = []
    g = torch.Generator(device="cuda").manual_seed(77)
    for b, sq, sk, hq, hkv, d in SHAPES:
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dt, generator=g)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt, generator=g)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt, generator=g)
        o = torch.empty_like(q)
        args = ctx.fwd_args(q, k, v, o, None, False)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        # SDPA takes GQA through enable_gqa
        sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)  # noqa: E731

        def unsplit():
            ctx.set_option(fattn.OPTION_DISABLE_SPLIT, 1)
            ctx.fwd_raw(args)
            ctx.set_option(fattn.OPTION_DISABLE_SPLIT, 0)

        calls = [("split", lambda: ctx.fwd_raw(args), None), ("unsplit", unsplit, None),
                 ("cudnn", sdpa, SDPBackend.CUDNN_ATTENTION), ("fa2", sdpa, SDPBackend.FLASH_ATTENTION)]
        ok = []
        for name, fn, be in calls:
            try:
                with contextlib.nullcontext() if be is None else sdpa_kernel([be]):
                    fn()
                torch.cuda.synchronize()
                ok.append((name, fn, be))
            except Exception:  # a backend that cannot run this shape
                pass
        samples = {name: [] for name, _, _ in ok}
        for rnd in range(3):
            for name, fn, be in ok[rnd % len(ok):] + ok[:rnd % len(ok)]:
                with contextlib.nullcontext() if be is None else sdpa_kernel([be]):
                    t, _ = compare.time_fn(fn, a.iters, settle_ms=a.settle_ms)
                samples[name] += t
        fl = 4.0 * b * hq * sq * sk * d
        r = {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv, "head_dim": d,
             "dtype": a.dtype}
        for name in ("split", "unsplit", "cudnn", "fa2"):
            r[name] = fl / statistics.median(samples[name]) / 1e12 if name in samples else None
        out.append(r)
        f = lambda x: "%7.1f" % x if x else "    n/a"  # noqa: E731
        print("%2d %5d %6d %4d %4d %4d | %s %s %s %s | %8.2f %8s" % (
            b, sq, sk, hq, hkv, d, f(r["split"]), f(r["unsplit"]), f(r["cudnn"]), f(r["fa2"]),
            r["split"] / r["unsplit"], "%.3f" % (r["split"] / r["cudnn"]) if r["cudnn"] else "n/a"), flush=True)
        del q, k, v, o
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
