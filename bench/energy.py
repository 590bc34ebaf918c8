#!/usr/bin/env python3
"""Energy per forward call below the power limit: fattn next to torch SDPA's cuDNN and
FlashAttention-2 backends, same shapes and inputs as bench/compare.py.

    python3 bench/energy.py [--shapes d:causal:seqlen,...] [--dtype bf16] [--window 2.0]

Under sustained load the H200 sits at its 700 W limit, so the throughput ratio of two
kernels there is close to the inverse ratio of their energy per FLOP (perf-notes, run 28
on). This reads that energy directly, away from the limit: for each backend, calls run in
short bursts (~10 ms of GPU time, CUDA events around each burst) separated by idle gaps
(4x the burst), so board power stays far below 700 W and the SM clock at its boost value;
NVML's total-energy counter (mJ) is read around the whole window, and the idle power
(read over an idle second just before) times the idle part of the window is subtracted:

    energy per call = (E_window - P_idle * (T_window - T_busy)) / calls

i.e. the energy drawn while the GPU ran the calls, static power included. Printed per
shape: mJ per call, pJ per FLOP, the busy time per call, the SM clock read after each
burst (median), and fattn's ratios to cuDNN.
"""
import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (torch, fattn, Case, Clocks, flops)
import torch  # noqa: E402
from torch.nn.attention import sdpa_kernel  # noqa: E402


def energy_mj(clocks):
    e = ctypes.c_ulonglong()
    if clocks.lib.nvmlDeviceGetTotalEnergyConsumption(clocks.h, ctypes.byref(e)) != 0:
        raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
    return e.value


def measure(clocks, fn, window_s, gap_factor=4.0, burst_ms=10.0):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    per_call = max(time.perf_counter() - t0, 1e-5)
    n = max(1, int(burst_ms * 1e-3 / per_call))
    time.sleep(1.0)  # back to idle
    e0, t0 = energy_mj(clocks), time.perf_counter()
    time.sleep(1.0)
    p_idle = (energy_mj(clocks) - e0) * 1e-3 / (time.perf_counter() - t0)
    calls, busy, mhz = 0, 0.0, []
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0, t0 = energy_mj(clocks), time.perf_counter()
    while time.perf_counter() - t0 < window_s:
        ev0.record()
        for _ in range(n):
            fn()
        ev1.record()
        ev1.synchronize()
        mhz.append(clocks.sample()[0])
        b = ev0.elapsed_time(ev1) * 1e-3
        busy += b
        calls += n
        time.sleep(gap_factor * b)
    t_w = time.perf_counter() - t0
    e_w = (energy_mj(clocks) - e0) * 1e-3
    return (e_w - p_idle * (t_w - busy)) / calls, busy / calls, statistics.median(mhz), p_idle, e_w / t_w


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="128:0:16384,128:1:4096,128:1:1024,256:1:2048,256:0:4096,64:0:4096",
                    help="head_dim:causal:seqlen, comma-separated (16k tokens, hidden 2048)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--window", type=float, default=2.0, help="seconds of duty-cycled calls per backend")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    clocks = compare.Clocks()
    ctx = compare.fattn.Context(compare.fattn.BACKEND_CUDA, 0)
    print("shape | backend: mJ/call, pJ/FLOP, ms busy/call, SM MHz, idle W, window W | fattn / cuDNN")
    for spec in a.shapes.split(","):
        d, causal, s = (int(x) for x in spec.split(":"))
        b, h = 16384 // s, 2048 // d
        case = compare.Case(ctx, dtype, b, s, h, d, bool(causal), 4321 + s + d)
        fl = compare.flops(b, h, s, s, d, causal)
        res = {}
        for name, fn, be in case.calls:
            with contextlib.nullcontext() if be is None else sdpa_kernel([be]):
                res[name] = measure(clocks, fn, a.window)
        shape = f"{a.dtype} d{d} {'causal' if causal else 'non-causal'} {s}"
        parts = [f"{n}: {r[0] * 1e3:.1f} mJ, {r[0] / fl * 1e12:.3f} pJ/FLOP, {r[1] * 1e3:.3f} ms, {r[2]:.0f} MHz, "
                 f"idle {r[3]:.0f} W, window {r[4]:.0f} W" for n, r in res.items()]
        print(shape + " | " + " | ".join(parts) +
              f" | energy {res['fattn'][0] / res['cudnn'][0]:.3f}, time {res['fattn'][1] / res['cudnn'][1]:.3f}",
              flush=True)
        del case


if __name__ == "__main__":
    main()
