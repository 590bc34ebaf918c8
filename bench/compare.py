#!/usr/bin/env python3
"""Side-by-side forward benchmark: fattn vs torch SDPA (cuDNN and FlashAttention-2
backends), measured in one process on the same inputs (DESIGN.md §7).

    python3 bench/compare.py [--dtypes bf16,fp16] [--head-dims 64,128,256]
        [--seqlens 512,...,16384] [--causal both|0|1] [--iters 4]
        [--json out.json] [--png out.png] [--ablation] [--clocks]

FLOPs = 4 * batch * heads * seqlen^2 * head_dim (halved for causal);
TFLOPs/s = FLOPs / median kernel time; fattn, cuDNN and FA2 take turns over 3 rounds per shape,
each round starting with the next backend, and in each turn a backend runs for --settle-ms
(500) before its timed samples.  Long runs hold the H200 at its 700 W limit, and the SM clock
it allows depends on the draw of whatever ran just before: without the settling, the backend
that followed the low-power FA2 turn ran its samples at up to 270 MHz more (perf-notes, run 28).
16k tokens in total (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / d),
so every input tensor is 64 MiB, larger than the 60 MB L2.
--ablation runs the paper's setting (batch 4, seqlen 8448, 16 heads, d 128,
bf16, non-causal) with the overlap and/or pingpong turned off.
"""
import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fattn  # noqa: E402

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Clocks:
    """SM clock (MHz) and board power (W) read through NVML (the driver's
    libnvidia-ml, through ctypes) while a backend's calls run: --clocks."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.h = ctypes.c_void_p()
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = getattr(p, "pci_bus_id", None)
        ok = -1
        if bus is not None:
            busid = b"%08x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0), bus, getattr(p, "pci_device_id", 0))
            ok = self.lib.nvmlDeviceGetHandleByPciBusId_v2(busid, ctypes.byref(self.h))
        if ok != 0 and self.lib.nvmlDeviceGetHandleByIndex_v2(torch.cuda.current_device(), ctypes.byref(self.h)) != 0:
            raise RuntimeError("no NVML handle for this device")

    def sample(self):
        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(mhz))  # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw))
        return mhz.value, mw.value / 1000.0


CLOCKS = None  # a Clocks when --clocks is given


def time_fn(fn, iters, warmup=5, batch=10, settle_ms=0.0):
    """(`iters` samples of (CUDA events around `batch` back-to-back calls) /
    batch, in seconds; (MHz, W) pairs read while they ran).  Batching keeps the GPU queue full, so host-side launch
    cost (ctypes for fattn, the dispatcher for torch) is not counted as idle
    GPU time for anyone.  With --clocks, NVML is read every 2 ms until the
    queued calls finish (NVML's power is an average over about a second, so it
    lags the clock); without it the pairs are [].  settle_ms: before timing, the
    calls run for at least that long, so the clock the power limit allows
    settles on this backend's own draw, not the previous backend's."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < settle_ms:
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        for _ in range(batch):
            fn()
        ends[i].record()
    clocks = []
    if CLOCKS is not None:
        while not ends[-1].query():
            clocks.append(CLOCKS.sample())
            time.sleep(0.002)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 / batch for s, e in zip(starts, ends)], clocks


def flops(b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d
    return f / 2 if causal and sq == sk else f


class Case:
    """One shape's inputs as the bench scripts draw them (Q, K, V independent N(0, 1),
    [b, s, h, d], from a CUDA generator seeded with `seed`; O and LSE written by fattn)
    and each backend's call on them: `calls` is [(name, fn, SDPA backend or None)], where
    an SDPA backend's fn must run under sdpa_kernel([backend]).  The object owns the
    tensors the calls read and write: keep it alive while calling them."""

    def __init__(self, ctx, dtype, b, s, h, d, causal, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.q, self.k, self.v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        ctx.set_stream(torch.cuda.current_stream().cuda_stream)
        args = ctx.fwd_args(self.q, self.k, self.v, self.o, self.lse, causal)
        qt, kt, vt = (x.transpose(1, 2) for x in (self.q, self.k, self.v))  # [b, h, s, d] views, as SDPA takes them
        sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))  # noqa: E731
        self.calls = [("fattn", lambda: ctx.fwd_raw(args), None), ("cudnn", sdpa, SDPBackend.CUDNN_ATTENTION),
                      ("fa2", sdpa, SDPBackend.FLASH_ATTENTION)]


def small_bench_args(doc, add=None):
    """The command line of the small comparison scripts (bench/split.py,
    bench/waves.py): their own options (add(ap)), then one dtype, samples per
    round, settle time and a JSON file.  Returns (args, torch dtype)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if add:
        add(ap)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--settle-ms", type=float, default=300.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    return a, torch.bfloat16 if a.dtype == "bf16" else torch.float16


def bench_case(ctx, dtype, b, s, h, d, causal, iters, peers=True, rounds=3, rotate=True, settle_ms=0.0,
               cooldown_ms=0.0, ab_option=None):
    case = Case(ctx, dtype, b, s, h, d, causal, 1234 + s + d)
    fl = flops(b, h, s, s, d, causal)
    res = {"dtype": str(dtype).split(".")[-1], "batch": b, "seqlen": s, "heads": h, "head_dim": d,
           "causal": bool(causal)}
    fns = [case.calls[0]]
    if ab_option is not None:  # the same calls with option ab_option set to 1 during this entry's turns
        fns.append(("fattn_ab", case.calls[0][1], "ab"))
    if peers:
        for name, fn, be in case.calls[1:]:
            try:
                with sdpa_kernel([be]):
                    fn()
                fns.append((name, fn, be))
            except Exception as e:  # a backend that cannot run this shape
                res[name] = None
                res[name + "_error"] = str(e).splitlines()[0][:120]
    # the backends take turns over `rounds` rounds (median over all samples):
    # the machine drifts by several percent within a run, and interleaving
    # makes that drift hit every backend alike
    # rotate: round r starts with backend r (mod their number), so none is
    # always the one that follows the low-power FA2 turn (run 27: the first
    # backend of a round ran at higher clocks under the power limit)
    samples = {name: [] for name, _, _ in fns}
    clocks = {name: [] for name, _, _ in fns}
    for rnd in range(rounds):
        k = rnd % len(fns) if rotate else 0
        for name, fn, be in fns[k:] + fns[:k]:
            if cooldown_ms > 0:  # burst timing: every turn starts from an idle GPU
                torch.cuda.synchronize()
                time.sleep(cooldown_ms / 1e3)
            if be == "ab":
                ctx.set_option(ab_option, 1)
            with contextlib.nullcontext() if be in (None, "ab") else sdpa_kernel([be]):
                t, c = time_fn(fn, iters, settle_ms=settle_ms)
            if be == "ab":
                ctx.set_option(ab_option, 0)
            samples[name] += t
            clocks[name] += c
    for name, _, _ in fns:
        res[name] = fl / statistics.median(samples[name]) / 1e12
        if clocks[name]:  # median SM clock and power while this backend ran
            res[name + "_mhz"] = statistics.median(c[0] for c in clocks[name])
            res[name + "_w"] = statistics.median(c[1] for c in clocks[name])
            res[name + "_clock_samples"] = len(clocks[name])
    del case
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="both", choices=["both", "0", "1"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=4, help="samples per backend per round (3 rounds)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--ablation-rounds", type=int, default=3, help="interleaved rounds of the ablation")
    ap.add_argument("--order", default="rotate", choices=["rotate", "fixed"],
                    help="backend order per round: rotated (round r starts with backend r) or always fattn, "
                         "cuDNN, FA2")
    ap.add_argument("--settle-ms", type=float, default=500.0,
                    help="each backend runs this long before its timed samples in every round")
    ap.add_argument("--cooldown-ms", type=float, default=0.0,
                    help="the GPU idles this long before every turn (burst timing: use with --settle-ms 0, "
                         "so each backend's samples run before the power limit lowers the clock)")
    ap.add_argument("--ab-option", choices=["disable_overlap", "disable_pingpong", "disable_pdl", "softmax_under_pv", "disable_split"],
                    help="also time fattn with this option set to 1, as one more backend taking turns "
                         "(a line 'A/B' under each row: its TFLOPs/s and their ratio to fattn's)")
    ap.add_argument("--clocks", action="store_true",
                    help="read the SM clock and board power (NVML) while each backend runs; printed after "
                         "each row and kept in the JSON (<backend>_mhz, <backend>_w)")
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch fattn without programmatic dependent launch (its set-up then cannot "
                         "overlap the previous call's tail)")
    a = ap.parse_args()
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    if a.clocks:
        global CLOCKS
        try:
            CLOCKS = Clocks()
        except (OSError, RuntimeError) as e:  # no NVML: time without it
            print("--clocks: NVML not available (%s); clocks not recorded" % e)
            a.clocks = False
    if a.no_pdl:
        ctx.set_option(fattn.OPTION_DISABLE_PDL, 1)
    print("device: %s, torch %s, cuDNN %s, fattn %s; backend order %s, settle %.0f ms, cool-down %.0f ms per turn" % (
        torch.cuda.get_device_name(), torch.__version__, torch.backends.cudnn.version(), fattn.__version__, a.order,
        a.settle_ms, a.cooldown_ms))
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "pdl": not a.no_pdl,
           "order": a.order, "settle_ms": a.settle_ms, "cooldown_ms": a.cooldown_ms, "results": [], "ablation": []}

    if a.ablation:
        print("\nablation: batch 4, seqlen 8448, 16 heads, head dim 128, bf16, non-causal (TFLOPs/s, median of %d "
              "interleaved rounds)" % a.ablation_rounds)
        # the variants interleaved over the rounds, median per variant: the
        # machine drifts by several percent within a run, and this way the
        # drift hits every variant alike.  The overlap variants run the
        # paper's placement (the softmax under the warpgroup's own PV GEMM),
        # which the shipped d128 kernel also has since v15 (run 35), so "full
        # design" is the shipped kernel; cuDNN and FA2 are timed beside it
        variants = (("overlap off, pingpong off", 0, 0, 0), ("pingpong only", 0, 1, 0),
                    ("overlap only", 1, 0, 1), ("full design (shipped)", 1, 1, 1))
        runs = {v[0]: [] for v in variants}
        for rnd in range(a.ablation_rounds):
            k = rnd % len(variants)  # each round starts with the next variant
            for name, ov, pp, upv in variants[k:] + variants[:k]:
                ctx.set_option(fattn.OPTION_DISABLE_OVERLAP, 1 - ov)
                ctx.set_option(fattn.OPTION_DISABLE_PINGPONG, 1 - pp)
                ctx.set_option(fattn.OPTION_SOFTMAX_UNDER_PV, upv)
                runs[name].append(bench_case(ctx, torch.bfloat16, 4, 8448, 16, 128, False, a.iters,
                                             peers=(name.startswith("full design") and rnd == 0), rounds=1,
                                             settle_ms=a.settle_ms))
        for name, _, _, _ in variants:
            r = dict(runs[name][0])
            vals = sorted(x["fattn"] for x in runs[name])
            r["fattn"] = vals[len(vals) // 2]
            r["fattn_rounds"] = [x["fattn"] for x in runs[name]]
            r["variant"] = name
            out["ablation"].append(r)
            extra = "" if r.get("cudnn") is None else "   cuDNN %.0f  FA2 %.0f" % (r["cudnn"], r["fa2"] or 0)
            print("  %-28s %6.0f  (rounds %s)%s" % (name, r["fattn"], " ".join("%.0f" % v for v in r["fattn_rounds"]),
                                                   extra), flush=True)
        ctx.set_option(fattn.OPTION_DISABLE_OVERLAP, 0)
        ctx.set_option(fattn.OPTION_DISABLE_PINGPONG, 0)
        ctx.set_option(fattn.OPTION_SOFTMAX_UNDER_PV, 0)

    ab_opt = None if a.ab_option is None else getattr(fattn, "OPTION_" + a.ab_option.upper())
    causals = [False, True] if a.causal == "both" else [a.causal == "1"]
    hdr = "%-5s %4s %-6s %6s | %7s %7s %7s | %8s %8s" % ("dtype", "d", "mask", "seqlen", "fattn", "cuDNN", "FA2",
                                                        "x cuDNN", "x FA2")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for dn in a.dtypes.split(","):
        for d in [int(x) for x in a.head_dims.split(",")]:
            for causal in causals:
                for s in [int(x) for x in a.seqlens.split(",")]:
                    b, h = max(1, a.tokens // s), a.hidden // d
                    r = bench_case(ctx, dts[dn], b, s, h, d, causal, a.iters, rotate=a.order == "rotate",
                                   settle_ms=a.settle_ms, cooldown_ms=a.cooldown_ms, ab_option=ab_opt)
                    out["results"].append(r)
                    rc = r["fattn"] / r["cudnn"] if r.get("cudnn") else float("nan")
                    rf = r["fattn"] / r["fa2"] if r.get("fa2") else float("nan")
                    print("%-5s %4d %-6s %6d | %7.1f %7s %7s | %8.3f %8.3f" % (
                        dn, d, "causal" if causal else "none", s, r["fattn"],
                        "%.1f" % r["cudnn"] if r.get("cudnn") else "n/a",
                        "%.1f" % r["fa2"] if r.get("fa2") else "n/a", rc, rf), flush=True)
                    if ab_opt is not None:
                        print("      A/B %s=1: %.1f TFLOPs/s, %.3f x fattn" % (a.ab_option, r["fattn_ab"],
                                                                       r["fattn_ab"] / r["fattn"]), flush=True)
                    if a.clocks:
                        print("      SM MHz / W (median while running): " + ", ".join(
                            "%s %s / %s" % (n, "%.0f" % r[n + "_mhz"] if n + "_mhz" in r else "-",
                                            "%.0f" % r[n + "_w"] if n + "_w" in r else "-")
                            for n in ("fattn", "cudnn", "fa2")), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.png and out["results"]:
        plot(out["results"], a.png)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = sorted({r["head_dim"] for r in results})
    masks = sorted({r["causal"] for r in results})
    dtypes = sorted({r["dtype"] for r in results})
    fig, axes = plt.subplots(len(masks) * len(dtypes), len(dims), figsize=(5 * len(dims), 3.6 * len(masks) * len(dtypes)),
                             squeeze=False)
    for i, (dt, m) in enumerate([(dt, m) for dt in dtypes for m in masks]):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            rs = sorted([r for r in results if r["dtype"] == dt and r["causal"] == m and r["head_dim"] == d],
                        key=lambda r: r["seqlen"])
            xs = [r["seqlen"] for r in rs]
            for key, label in (("fattn", "fattn"), ("cudnn", "cuDNN (torch SDPA)"), ("fa2", "FA2 (torch SDPA)")):
                ys = [r.get(key) or float("nan") for r in rs]
                ax.plot(xs, ys, marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_title("%s, head dim %d, %s" % (dt, d, "causal" if m else "non-causal"))
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOPs/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
