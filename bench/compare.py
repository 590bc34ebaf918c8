#!/usr/bin/env python3
"""Side-by-side forward benchmark: fattn next to torch SDPA (cuDNN and FlashAttention-2
backends), FlashAttention-3 (the fa3-fwd wheel) and optionally a second fattn build,
measured in one process on the same inputs (DESIGN.md §7).

    python3 bench/compare.py [--rows all|table|smoke] [--dtypes bf16,fp16] [--head-dims 64,128,256]
        [--seqlens 512,...,16384] [--causal both|0|1] [--backends fattn,fattn-b,cudnn,fa2,fa3]
        [--fattn-lib-b build-old/libfattn.so] [--rounds 3] [--iters 4] [--settle-ms 500]
        [--json out.json] [--png out.png] [--ablation] [--clocks] [--dry-run]
    python3 bench/compare.py --fp8 [--backends fattn,fattn-fp8,fattn-fp8-e2e,fa3,fa3-fp8] [--head-dims ..]
        [--seqlens 1024,4096,16384] [--causal both|0|1] [--rounds 3] [--clocks] [--json out.json] [--dry-run]
    python3 bench/compare.py --bwd [--bwd-deterministic] [--bwd-no-fwd] [--backends fattn,cudnn,fa2,fa4]
        [--dtypes bf16] [--head-dims ..] [--seqlens 1024,...,16384] [--causal both|0|1] [--clocks] [--json out.json]
        [--dry-run]
    python3 bench/compare.py --variants [--bwd] [--kinds window,softcap,sinks,hd192] [--causal both|0|1]
        [--backends fattn,fattn-plain,cudnn,fa3,fa4] [--clocks] [--json out.json] [--dry-run | --cpu-check]

FLOPs = 4 * batch * heads * seqlen^2 * head_dim (halved for causal);
TFLOPs/s = FLOPs / median kernel time; the backends take turns over --rounds (3) rounds per shape,
each round starting with the next backend, and in each turn a backend runs for --settle-ms
(500) before its timed samples.  Long runs hold the H200 at its 700 W limit, and the SM clock
it allows depends on the draw of whatever ran just before: without the settling, the backend
that followed the low-power FA2 turn ran its samples at up to 270 MHz more (perf-notes, run 28).
16k tokens in total (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / d),
so every input tensor is 64 MiB, larger than the 60 MB L2.
--rows table is the forward table's 60 rows (docs/benchmarks.md) (seqlen 1024-16384); all (the default) adds seqlen 512.
Backends: fattn (the library `fattn` loads: FATTN_LIBRARY, else build/), fattn-b (the library
given by --fattn-lib-b, e.g. the previous commit's build: a column new/old = fattn / fattn-b),
cudnn and fa2 (torch SDPA), fa3 (`from fa3_fwd_interface import flash_attn_func`, the fa3-fwd
wheel on the path: bf16 only, its fp16 rows and a failed import read n/a).  Each row also checks
every backend's output against fattn's once (maxdiff in the JSON, a line when above 0.05).
The expected duration is printed first (--dry-run prints only that, without torch or a GPU):
one device command may run 10 minutes, so split long tables with --dtypes / --causal.
--ablation runs the paper's setting (batch 4, seqlen 8448, 16 heads, d 128,
bf16, non-causal) with the overlap and/or pingpong turned off.
--fp8 times the FP8 forward instead (same shapes, seqlen 1024 / 4096 / 16384 by default, the same
turns): fattn-fp8 is fattn's FP8 kernel alone (fattn_fwd on e4m3 Q, K, V quantised beforehand by
torch with one scale per 128 rows, through python/fattn/_capi.py's structs), fa3-fp8 FA3's FP8 kernel
alone (e4m3 with per-(batch, kv head) descales), fattn-fp8-e2e fattn_fwd_fp8 from the bf16 inputs
(quantise, Hadamard on Q and K, attend), fattn and fa3 the bf16 calls; one FLOP count for all.
Ratios fattn FP8 / FA3 FP8, e2e / fattn bf16, e2e / FA3 bf16; maxdiff against fattn's bf16 O.
A backend that fails (say the FP8 kernel is not there yet) prints its error once and is left out.
--bwd times the backward (bf16, the table's seqlens 1024-16384 by default), each call alone, and each
backend's forward alone, all taking turns as above: fattn (fattn_bwd on the O and LSE of one fattn_fwd,
through python/fattn/_capi.py's BwdArgs: no forward in the timed calls), cudnn and fa2 (torch SDPA) and fa4
(`from flash_attn.cute import flash_attn_func`, package flash-attn-4, when importable; else n/a with why):
torch.autograd.grad(O, (q, k, v), dO, retain_graph=True) on one forward's graph.  Backward FLOPs = 2.5 x the
forward's.  Ratios fattn bwd / cuDNN, / FA2, / FA4; fattn's cells read 'unsupported' where fattn_bwd answers
FATTN_ERROR_UNSUPPORTED (the row goes on); dQ, dK, dV compared with fattn's (or the first backend's that ran).
--bwd-deterministic adds fattn_bwd with deterministic = 1 (its cost against the default, a bitwise repeat).
--fattn-engine portable (any mode) times fattn's portable engine (FlashAttention-2 style, issue 41) on a Hopper
GPU: it sets FATTN_CUDA_ENGINE for every fattn context the process creates (read at creation, fattn.h), checks
that the timed context runs it (fattn_ctx_engine) and records it as fattn_engine in the JSON, as every run does;
the fattn column is then the portable engine's and "x FA2" its ratio to torch SDPA's FlashAttention-2.
--variants (bench/compare_variants.py, whose docstring has the rows and FLOP counts) times issue 37's attention
variants (window, softcap, learnable sinks, head_dim 192 / head_dim_v 128) beside fattn without the variant and the
peers that have it, forward, or the backward with --bwd; --cpu-check builds its rows small on the CPU engine.
"""
import argparse
import contextlib
import ctypes
import importlib.util
import json
import math
import os
import statistics
import sys
import time

T0 = time.perf_counter()  # the run's duration counts torch's import and the start-up
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
IMPORT_ERROR = None  # why torch or fattn did not import: only `compare.py --dry-run` runs without them
try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
except ImportError as e:
    if __name__ != "__main__":  # the scripts that import compare need torch
        raise
    torch, IMPORT_ERROR = None, e
try:
    import fattn  # noqa: E402
except (ImportError, OSError) as e:
    if __name__ != "__main__":
        raise
    fattn, IMPORT_ERROR = None, IMPORT_ERROR or e

BACKENDS = ("fattn", "fattn-b", "cudnn", "fa2", "fa3")
LABEL = {"fattn": "fattn", "fattn-b": "fattn-b", "cudnn": "cuDNN", "fa2": "FA2", "fa3": "FA3", "fattn_ab": "A/B"}
# ratio columns: (header, denominator); the numerator is always fattn
RATIOS = (("x cuDNN", "cudnn"), ("x FA3", "fa3"), ("x FA2", "fa2"), ("new/old", "fattn-b"))
ROWS = {"all": ("bf16,fp16", "64,128,256", "512,1024,2048,4096,8192,16384", "both"),
        "table": ("bf16,fp16", "64,128,256", "1024,2048,4096,8192,16384", "both"),  # the forward table's 60 rows (docs/benchmarks.md)
        "smoke": ("bf16,fp16", "64,128,256", "1024", "both"),
        "fp8": ("bf16", "64,128,256", "1024,4096,16384", "both"),  # with --fp8 (dtypes unused there)
        "bwd": ("bf16", "64,128,256", "1024,2048,4096,8192,16384", "both")}  # with --bwd
DT = {"bfloat16": "bf16", "float16": "fp16"}  # the JSON's dtype names -> the command line's
MAXDIFF_WARN = 0.05  # a wrong mask or scale moves outputs by 0.1-1; bf16 rounding by < 0.02


def key(name):
    """A backend's key in the JSON (fattn-b -> fattn_b)."""
    return name.replace("-", "_")


def fattn_engine(ctx):
    """The engine and architecture fattn's timed context runs (fattn_ctx_engine: "cuda hopper sm_90", "cuda
    portable sm_90 (FATTN_CUDA_ENGINE)"); exits when --fattn-engine (FATTN_CUDA_ENGINE) named another."""
    e = getattr(ctx, "engine", None) or "unknown (a library without fattn_ctx_engine)"
    want = os.environ.get("FATTN_CUDA_ENGINE", "")
    if want in ("hopper", "portable") and not e.startswith("cuda " + want):
        sys.exit("compare.py: FATTN_CUDA_ENGINE=%s, but fattn's context runs %s" % (want, e))
    print("fattn engine: %s" % e)
    return e


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


def init_clocks(a):
    """--clocks: start NVML (CLOCKS); without it, say so and time without."""
    global CLOCKS
    if a.clocks:
        try:
            CLOCKS = Clocks()
        except (OSError, RuntimeError) as e:  # no NVML: time without it
            print("--clocks: NVML not available (%s); clocks not recorded" % e)
            a.clocks = False


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


def load_fa3():
    """FlashAttention-3's forward from the fa3-fwd wheel: (flash_attn_func, version), or (None, why not)."""
    try:
        from fa3_fwd_interface import flash_attn_func
    except Exception as e:  # ImportError, or its extension failing to load against this torch
        return None, "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:160])
    try:
        from importlib.metadata import version
        return flash_attn_func, "fa3-fwd " + version("fa3_fwd")
    except Exception:  # installed without its dist-info
        return flash_attn_func, "fa3-fwd (version unknown)"


def fa3_call(fa3, q, k, v, causal):
    """The FA3 call on [b, s, h, d] tensors, returning O.  fa3-fwd 0.0.3's flash_attn_func returns O
    alone (O and LSE with return_attn_probs=True); older FA3 interfaces return (O, LSE).  Its FP8 form
    takes q/k/v_descale float32 (batch, heads_kv); the wheel has no fp16 kernels."""
    if q.dtype != torch.bfloat16:
        def unsupported():
            raise NotImplementedError("the fa3-fwd wheel has bf16 and FP8 kernels only")
        return unsupported
    scale = q.shape[-1] ** -0.5

    def fn():
        r = fa3(q, k, v, softmax_scale=scale, causal=bool(causal))
        return r[0] if isinstance(r, (tuple, list)) else r
    return fn


def mapped_files():
    with open("/proc/self/maps") as f:
        return {p[5].strip() for p in (line.split(None, 5) for line in f) if len(p) == 6}


class FattnB:
    """A second libfattn.so (--fattn-lib-b) beside the one `fattn` loaded, for old-against-new runs:
    python/fattn (or --fattn-py-b, say the old tree's python/fattn if the C structs changed) runs
    again as module fattn_b with FATTN_LIBRARY set to the second library, so it holds its own
    ctypes handle and its own context, and `fattn`'s are untouched (ctypes opens libraries
    RTLD_LOCAL and libfattn exports only its API, so the two copies do not bind to each other).
    dlopen gives one handle per file: when the library is the one fattn already holds (the same
    path or a hard link), fattn-b times the same code (an A/A run), and `same` says so.
    backend: the context's kind (BACKEND_CPU to try the loading on a machine without a GPU)."""

    def __init__(self, lib, py=None, backend="BACKEND_CUDA"):
        self.path = os.path.realpath(lib)
        if not os.path.isfile(self.path):
            sys.exit("--fattn-lib-b: no file %s" % lib)
        init = os.path.join(py or os.path.join(HERE, "..", "python", "fattn"), "__init__.py")
        spec = importlib.util.spec_from_file_location("fattn_b", init,
                                                      submodule_search_locations=[os.path.dirname(init)])
        self.mod = importlib.util.module_from_spec(spec)
        sys.modules["fattn_b"] = self.mod
        before, saved = mapped_files(), os.environ.get("FATTN_LIBRARY")
        os.environ["FATTN_LIBRARY"] = self.path
        try:  # set while fattn_b loads its library, at import or at first use
            spec.loader.exec_module(self.mod)
            self.ctx = self.mod.Context(getattr(self.mod, backend), 0)
            self.version = getattr(self.mod, "__version__", "?")
        finally:
            if saved is None:
                del os.environ["FATTN_LIBRARY"]
            else:
                os.environ["FATTN_LIBRARY"] = saved
        self.same = self.path not in mapped_files() - before


class Case:
    """One shape's inputs as the bench scripts draw them (Q, K, V independent N(0, 1),
    [b, s, h, d], from a CUDA generator seeded with `seed`; O and LSE written by fattn)
    and each backend's call on them: `calls` is [(name, fn, SDPA backend or None)], where
    an SDPA backend's fn must run under sdpa_kernel([backend]): fattn, cudnn and fa2, then
    fattn-b with ctx_b (a FattnB's context; it writes o_b, lse_b) and fa3 with fa3 (load_fa3's
    function).  The object owns the tensors the calls read and write: keep it alive while
    calling them."""

    def __init__(self, ctx, dtype, b, s, h, d, causal, seed, ctx_b=None, fa3=None):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.q, self.k, self.v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        stream = torch.cuda.current_stream().cuda_stream
        ctx.set_stream(stream)
        args = ctx.fwd_args(self.q, self.k, self.v, self.o, self.lse, causal)
        qt, kt, vt = (x.transpose(1, 2) for x in (self.q, self.k, self.v))  # [b, h, s, d] views, as SDPA takes them
        sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))  # noqa: E731
        self.calls = [("fattn", lambda: ctx.fwd_raw(args), None), ("cudnn", sdpa, SDPBackend.CUDNN_ATTENTION),
                      ("fa2", sdpa, SDPBackend.FLASH_ATTENTION)]
        if ctx_b is not None:
            self.o_b, self.lse_b = torch.empty_like(self.o), torch.empty_like(self.lse)
            ctx_b.set_stream(stream)
            args_b = ctx_b.fwd_args(self.q, self.k, self.v, self.o_b, self.lse_b, causal)
            self.calls.append(("fattn-b", lambda: ctx_b.fwd_raw(args_b), None))
        if fa3 is not None:
            self.calls.append(("fa3", fa3_call(fa3, self.q, self.k, self.v, causal), None))

    def output(self, name, r):
        """The [b, s, h, d] output of backend `name`'s call that returned r."""
        if name in ("fattn", "fattn-b"):
            return self.o if name == "fattn" else self.o_b
        return r.transpose(1, 2) if name in ("cudnn", "fa2") else r


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


@contextlib.contextmanager
def option_set(ctx, option):
    ctx.set_option(option, 1)
    try:
        yield
    finally:
        ctx.set_option(option, 0)


def turn_context(be, ctx=None, ab_option=None):
    """What a backend's calls run under: nothing (None), fattn's A/B option set ("ab"), or the SDPA backend."""
    if be is None:
        return contextlib.nullcontext()
    return option_set(ctx, ab_option) if be == "ab" else sdpa_kernel([be])


def bench_case(ctx, dtype, b, s, h, d, causal, iters, peers=True, rounds=3, rotate=True, settle_ms=0.0,
               cooldown_ms=0.0, ab_option=None, backends=("fattn", "cudnn", "fa2"), ctx_b=None, fa3=None):
    """One shape: fattn and (peers) the other backends of `backends` (fattn-b needs ctx_b, fa3 needs
    fa3) taking turns; TFLOPs/s per backend, None with <name>_error for one that cannot run it."""
    t_row = time.perf_counter()
    case = Case(ctx, dtype, b, s, h, d, causal, 1234 + s + d, ctx_b if "fattn-b" in backends else None,
                fa3 if "fa3" in backends else None)
    fl = flops(b, h, s, s, d, causal)
    res = {"dtype": str(dtype).split(".")[-1], "batch": b, "seqlen": s, "heads": h, "head_dim": d,
           "causal": bool(causal)}
    calls = {name: (fn, be) for name, fn, be in case.calls}
    fns = [("fattn",) + calls["fattn"]]
    if ab_option is not None:  # the same calls with option ab_option set to 1 during this entry's turns
        fns.append(("fattn_ab", calls["fattn"][0], "ab"))
    if peers:
        calls["fattn"][0]()  # the reference output for the others' maxdiff
        for name in backends:
            if name == "fattn":
                continue
            if name not in calls:
                res[key(name)], res[key(name) + "_error"] = None, "not loaded"
                continue
            fn, be = calls[name]
            try:  # a backend that cannot run this shape says so here
                with turn_context(be):
                    r = fn()
                torch.cuda.synchronize()
            except Exception as e:
                res[key(name)] = None
                res[key(name) + "_error"] = (str(e).splitlines() or [type(e).__name__])[0][:120]
                continue
            try:  # largest |O - fattn's O|: the same mask and scale read below MAXDIFF_WARN
                res[key(name) + "_maxdiff"] = float((case.output(name, r) - case.o).abs().max().item())
            except Exception:  # an output this script cannot read: time it all the same
                res[key(name) + "_maxdiff"] = None
            fns.append((name, fn, be))
    take_turns(res, fns, fl, iters, rounds, rotate, settle_ms, cooldown_ms, ctx, ab_option)
    del case
    res["row_s"] = round(time.perf_counter() - t_row, 2)
    return res


def take_turns(res, fns, fl, iters, rounds=3, rotate=True, settle_ms=0.0, cooldown_ms=0.0, ctx=None,
               ab_option=None):
    """The backends of fns [(name, fn, what its calls run under: None, an SDPA backend or "ab")]
    take turns over `rounds` rounds; res[key(name)] = fl / median sample / 1e12 (TFLOPs/s), and with
    --clocks <key>_mhz, <key>_w, <key>_clock_samples.  fl: the FLOPs of one call, or {name: FLOPs} when
    the calls differ (--bwd: backward and forward entries in one rotation)."""
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
            with turn_context(be, ctx, ab_option):
                t, c = time_fn(fn, iters, settle_ms=settle_ms)
            samples[name] += t
            clocks[name] += c
    for name, _, _ in fns:
        n = key(name)
        res[n] = (fl[name] if isinstance(fl, dict) else fl) / statistics.median(samples[name]) / 1e12
        if clocks[name]:  # median SM clock and power while this backend ran
            res[n + "_mhz"] = statistics.median(c[0] for c in clocks[name])
            res[n + "_w"] = statistics.median(c[1] for c in clocks[name])
            res[n + "_clock_samples"] = len(clocks[name])


# ------------------------------------------------------------------ FP8 rows (--fp8)

FP8_BACKENDS = ("fattn", "fattn-fp8", "fattn-fp8-b", "fattn-fp8-e2e", "fa3", "fa3-fp8")
FP8_LABEL = {"fattn": "fattn bf16", "fattn-fp8": "fattn FP8", "fattn-fp8-b": "FP8 lib-b", "fattn-fp8-e2e": "fattn e2e",
             "fa3": "FA3 bf16", "fa3-fp8": "FA3 FP8"}
# ratio columns of the FP8 table: (header, numerator, denominator)
FP8_RATIOS = (("FP8/FA3-8", "fattn-fp8", "fa3-fp8"), ("new/old", "fattn-fp8", "fattn-fp8-b"),
              ("e2e/bf16", "fattn-fp8-e2e", "fattn"), ("e2e/FA3-16", "fattn-fp8-e2e", "fa3"))
FP8_BLOCK = 128  # rows per scale of Q, K and V: fattn's kernel alone and fattn_fwd_fp8
FP8_BLOCK_D128_KV = 128  # K and V at head dim 128 (--fp8-d128-kv-block; 192 selects its 192-key kernels)


def fp8_blocks(d):
    """rows per scale of Q, K, V at head dim d (the e2e rows use them too)"""
    kv = FP8_BLOCK_D128_KV if d == 128 else FP8_BLOCK
    return (FP8_BLOCK, kv, kv)
FP8_SEED = 0     # fattn_fwd_fp8's rotation signs
E4M3_MAX = 448.0
FP8_MAXDIFF_WARN = 0.25  # |O_fp8 - fattn's bf16 O| on N(0,1) inputs: a few 1e-2; a wrong scale: >= 0.5


class Fp8Options(ctypes.Structure):
    """include/fattn.h's fattn_fp8_options, until python/fattn/_capi.py mirrors it (then its struct is used)."""
    _fields_ = [("granularity", ctypes.c_int), ("block_rows_q", ctypes.c_int32), ("block_rows_k", ctypes.c_int32),
                ("block_rows_v", ctypes.c_int32), ("rotate", ctypes.c_int32), ("seed", ctypes.c_uint64)]


def fwd_fp8_binding():
    """(fattn_fwd_fp8 of the loaded library, its options struct type); RuntimeError when the library
    has no such symbol."""
    from fattn import _capi, _core
    try:
        fn = getattr(_core.lib, "fattn_fwd_fp8")
    except AttributeError:
        raise RuntimeError("%s has no fattn_fwd_fp8 (built before it)" % _core.library_path)
    proto = _capi.PROTOTYPES.get("fattn_fwd_fp8")
    if proto:  # bound by _capi.bind: its own struct
        return fn, proto[1][2]._type_
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_capi.FwdArgs), ctypes.POINTER(Fp8Options)]
    return fn, Fp8Options


def e4m3_block(x, block):
    """x [b, s, h, d] -> (e4m3 codes [b, s, h, d], float32 scales [b, h, ceil(s / block)]): amax / 448 per
    block of `block` rows of each (batch, head), the layout of fattn_tensor.scale (1 for an all-zero block)."""
    b, s, h, d = x.shape
    nb = -(-s // block)
    xf = x.float()
    if nb * block != s:
        xf = torch.cat([xf, xf.new_zeros(b, nb * block - s, h, d)], 1)
    xb = xf.view(b, nb, block, h, d)
    amax = xb.abs().amax(dim=(2, 4))  # [b, nb, h]
    sc = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = (xb / sc[:, :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).view(b, nb * block, h, d)[:, :s]
    return codes.to(torch.float8_e4m3fn).contiguous(), sc.permute(0, 2, 1).contiguous()


def e4m3_head(x):
    """x [b, s, h, d] -> (e4m3 codes, float32 descales [b, h]): FA3's per-(batch, kv head) scales."""
    xf = x.float()
    amax = xf.abs().amax(dim=(1, 3))
    sc = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).contiguous()
    return (xf / sc[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).contiguous(), sc


def fp8_fwd_args(codes, scales, o, lse, causal, mod=None):
    """fattn_fwd's arguments (python/fattn/_capi.py's structs; of module mod, fattn_b for the
    --fattn-lib-b library) for packed e4m3 q, k, v [b, s, h, d] with float32 scales
    [b, h, ceil(s / block)] (blocks: fp8_blocks(d)), bf16 o and float32 lse [b, h, s].
    The struct holds pointers: it keeps the tensors alive."""
    mod = mod or fattn
    _capi = mod._capi
    b, s, h, d = codes[0].shape
    st = (s * h * d, h * d, d)  # packed BSHD strides, in elements
    a = _capi.FwdArgs()
    a.p = _capi.Problem(b, s, s, h, h, d, d, 0.0, int(bool(causal)), None, None)
    a.q, a.k, a.v = (_capi.Tensor(c.data_ptr(), mod.E4M3, st[0], st[1], st[2], sc.data_ptr(), blk)
                     for c, sc, blk in zip(codes, scales, fp8_blocks(d)))
    a.o = _capi.Tensor(o.data_ptr(), mod.BF16, st[0], st[1], st[2], None, 0)
    a.lse = lse.data_ptr()
    a._keep = (codes, scales, o, lse)
    return a


def raiser(e):
    def fn():
        raise e
    return fn


class Fp8Case:
    """One shape of the FP8 table: bf16 Q, K, V ~ N(0, 1) [b, s, h, d] (the seed's CUDA generator), their
    e4m3 codes with block scales (fattn's kernel) and with per-(batch, head) descales (FA3's), and each
    backend's call: `calls` is [(name, fn, None)] in `backends` order; a backend whose set-up fails
    (fattn_fwd_fp8 missing, FA3 not loaded) gets a call that raises why."""

    def __init__(self, ctx, b, s, h, d, causal, seed, backends, fa3=None, fb=None):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.fb = fb  # FattnB: the --fattn-lib-b library, for fattn-fp8-b
        self.coded = None
        self.q, self.k, self.v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                                  for _ in range(3))
        ctx.set_stream(torch.cuda.current_stream().cuda_stream)
        self.out = {}  # name -> the O tensor fattn's calls write
        self.calls = []
        for name in backends:
            try:
                fn = self.make(name, ctx, causal, fa3)
            except Exception as e:  # noqa: BLE001 - the row records it
                fn = raiser(e)
            self.calls.append((name, fn, None))

    def make(self, name, ctx, causal, fa3):
        q, k, v = self.q, self.k, self.v
        b, s, h, d = q.shape

        def lse():
            return torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        if name in ("fattn", "fattn-fp8-e2e"):
            args = ctx.fwd_args(q, k, v, self.out.setdefault(name, torch.empty_like(q)), lse(), causal)
            if name == "fattn":
                return lambda: ctx.fwd_raw(args)
            fn, opt_t = fwd_fp8_binding()
            # FATTN_QUANT_BLOCK, fp8_blocks rows per scale, Q and K rotated (fields in the header's order)
            opt = opt_t(0, *fp8_blocks(q.shape[-1]), 1, FP8_SEED)

            def e2e():
                with ctx._lock:
                    ctx._check(fn(ctx._handle(), ctypes.byref(args), ctypes.byref(opt)), "fattn_fwd_fp8")
            return e2e
        if name in ("fattn-fp8", "fattn-fp8-b"):
            if self.coded is None:  # both libraries on the same codes
                self.coded = [e4m3_block(x, blk) for x, blk in zip((q, k, v), fp8_blocks(q.shape[-1]))]
            coded = self.coded
            c = ctx if name == "fattn-fp8" else self.fb.ctx
            if name == "fattn-fp8-b":
                c.set_stream(torch.cuda.current_stream().cuda_stream)
            args = fp8_fwd_args([c_ for c_, _ in coded], [sc for _, sc in coded],
                                self.out.setdefault(name, torch.empty_like(q)), lse(), causal,
                                None if name == "fattn-fp8" else self.fb.mod)
            return lambda: c.fwd_raw(args)
        if fa3 is None:
            raise RuntimeError("FA3 not loaded")
        if name == "fa3":
            return fa3_call(fa3, q, k, v, causal)
        if name == "fa3-fp8":
            (q8, qs), (k8, ks), (v8, vs) = (e4m3_head(x) for x in (q, k, v))
            scale = d ** -0.5

            def fa3_fp8():
                r = fa3(q8, k8, v8, softmax_scale=scale, causal=bool(causal), q_descale=qs, k_descale=ks,
                        v_descale=vs)
                return r[0] if isinstance(r, (tuple, list)) else r
            return fa3_fp8
        raise ValueError(name)

    def output(self, name, r):
        return self.out.get(name, r)


def bench_fp8_case(ctx, b, s, h, d, causal, a, backends, fa3=None, fb=None):
    """One FP8 row: every backend once (the failing ones record <name>_error, and are not timed;
    maxdiff against fattn's bf16 O), then the others take turns as in bench_case."""
    t_row = time.perf_counter()
    case = Fp8Case(ctx, b, s, h, d, causal, 1234 + s + d, backends, fa3, fb)
    res = {"dtype": "fp8", "batch": b, "seqlen": s, "heads": h, "head_dim": d, "causal": bool(causal)}
    fns, ref = [], None
    for name, fn, be in sorted(case.calls, key=lambda c: c[0] != "fattn"):  # fattn's O first: the reference
        try:
            r = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - e.g. the FP8 kernel not there yet: said, and the row goes on
            res[key(name)] = None
            res[key(name) + "_error"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
            continue
        o = case.output(name, r)
        if name == "fattn":
            ref = o
        elif ref is not None:
            try:
                res[key(name) + "_maxdiff"] = float((o.float() - ref.float()).abs().max().item())
            except Exception:  # noqa: BLE001 - an output this script cannot read: timed all the same
                res[key(name) + "_maxdiff"] = None
        fns.append((name, fn, be))
    fns.sort(key=lambda f: backends.index(f[0]))
    if fns:
        take_turns(res, fns, flops(b, h, s, s, d, causal), a.iters, a.rounds, a.order == "rotate", a.settle_ms,
                   a.cooldown_ms)
    del case
    res["row_s"] = round(time.perf_counter() - t_row, 2)
    return res


def fp8_ratio(r, num, den):
    return r[key(num)] / r[key(den)] if r.get(key(num)) and r.get(key(den)) else None


def main_fp8(a, ap):
    """--fp8: fattn's FP8 kernel alone and FA3's, fattn_fwd_fp8 from bf16 inputs (quantise, rotate,
    attend), fattn bf16 and FA3 bf16, taking turns per row; ratios per row and over the rows."""
    for opt, given in (("--ablation", a.ablation), ("--ab-option", a.ab_option)):
        if given:
            ap.error("%s is not available with --fp8" % opt)
    global FP8_BLOCK_D128_KV
    FP8_BLOCK_D128_KV = a.fp8_d128_kv_block
    backends = a.backends.split(",") if a.backends else [n for n in FP8_BACKENDS if n != "fattn-fp8-b" or a.fattn_lib_b]
    bad = [n for n in backends if n not in FP8_BACKENDS]
    if ("fattn-fp8-b" in backends) != bool(a.fattn_lib_b):
        ap.error("--fp8: backend fattn-fp8-b and --fattn-lib-b go together")
    if bad or not backends or len(set(backends)) != len(backends):
        ap.error("--backends with --fp8: %s (from %s, once each)" % (",".join(bad) or "a name twice",
                                                                     ",".join(FP8_BACKENDS)))
    causals = [False, True] if a.causal == "both" else [a.causal == "1"]
    rows = [("fp8", d, causal, s, max(1, a.tokens // s), a.hidden // d)
            for d in [int(x) for x in a.head_dims.split(",")] for causal in causals
            for s in [int(x) for x in a.seqlens.split(",")]]
    want_fa3 = any(n.startswith("fa3") for n in backends)
    fa3, fa3_info = (None, "not in --backends") if not want_fa3 or a.dry_run else (
        load_fa3() if torch is not None else (None, "torch is not importable"))
    est = estimate_s(rows, backends, a, fa3_ok=fa3 is not None or a.dry_run)
    print("%d FP8 rows (d %s; seqlen %s; causal %s; batch = %d / seqlen, heads = %d / d) x backends %s x %d rounds "
          "x (settle %.0f ms + %d x 10 calls): expected ~%.0f s (%.1f min)" % (
              len(rows), a.head_dims, a.seqlens, a.causal, a.tokens, a.hidden, ",".join(backends), a.rounds,
              a.settle_ms, a.iters, est, est / 60))
    for _, d, causal, s, b, h in rows:
        print("  d %3d %-6s seqlen %5d: batch %3d, heads %3d, %.3f TFLOP per call" % (
            d, "causal" if causal else "none", s, b, h, flops(b, h, s, s, d, causal) / 1e12))
    if est > 540:
        print("  over 9 minutes: one device command may run 10; split it with --causal, --head-dims or --seqlens")
    if a.dry_run:
        return
    if IMPORT_ERROR is not None:
        sys.exit("compare.py: %s (torch and the fattn library are needed; --dry-run runs without)" % IMPORT_ERROR)
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    fb = FattnB(a.fattn_lib_b, a.fattn_py_b) if a.fattn_lib_b else None
    init_clocks(a)
    engine = fattn_engine(ctx)
    if a.no_pdl:
        ctx.set_option(fattn.OPTION_DISABLE_PDL, 1)
        if fb:
            fb.ctx.set_option(fb.mod.OPTION_DISABLE_PDL, 1)
    print("device: %s, torch %s, fattn %s (%s); backend order %s, settle %.0f ms, cool-down %.0f ms per turn" % (
        torch.cuda.get_device_name(), torch.__version__, fattn.__version__, fattn.library_path, a.order,
        a.settle_ms, a.cooldown_ms))
    print("FA3: %s" % (fa3_info if fa3 is not None else "n/a (%s); its columns read n/a" % fa3_info))
    print("fattn FP8: fattn_fwd on e4m3 Q, K, V with one scale per %d rows (K, V: %d at d128; quantised by torch beforehand); "
          "FA3 FP8: e4m3 with per-(batch, kv head) descales;\nfattn e2e: fattn_fwd_fp8 from the bf16 inputs "
          "(quantise with blocks of %d rows, Hadamard on Q and K, attend). TFLOPs/s, one FLOP count for all"
          % (FP8_BLOCK, FP8_BLOCK_D128_KV, FP8_BLOCK))
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "fattn_version": fattn.__version__,
           "fattn_library": fattn.library_path, "fattn_engine": engine, "fp8": True, "fp8_block": FP8_BLOCK, "fp8_block_d128_kv": FP8_BLOCK_D128_KV, "pdl": not a.no_pdl,
           "backends": backends, "fa3_version": fa3_info if fa3 else None,
           "fa3_unavailable": None if fa3 else fa3_info, "order": a.order, "rounds": a.rounds, "iters": a.iters,
           "settle_ms": a.settle_ms, "cooldown_ms": a.cooldown_ms, "estimate_s": round(est), "results": []}
    ratios = [(hdr, n, dn) for hdr, n, dn in FP8_RATIOS if n in backends and dn in backends]
    hdr = "%4s %-6s %6s | %s | %s" % ("d", "mask", "seqlen", " ".join("%10s" % FP8_LABEL[n] for n in backends),
                                      " ".join("%10s" % h for h, _, _ in ratios))
    print("\n" + hdr + "\n" + "-" * len(hdr))
    errors_seen = set()
    for _, d, causal, s, b, h in rows:
        r = bench_fp8_case(ctx, b, s, h, d, causal, a, backends, fa3, fb)
        out["results"].append(r)
        out["elapsed_s"] = round(time.perf_counter() - T0)
        if a.json:  # after every row, so a command stopped at its time limit keeps the rows it measured
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        print("%4d %-6s %6d | %s | %s" % (d, "causal" if causal else "none", s,
                                          " ".join(fmt(r.get(key(n)), "%10.1f") for n in backends),
                                          " ".join(fmt(fp8_ratio(r, n, dn), "%10.3f") for _, n, dn in ratios)),
              flush=True)
        for n in backends:
            e = r.get(key(n) + "_error")
            if e and (n, e) not in errors_seen:  # each distinct error once
                errors_seen.add((n, e))
                print("      %s: %s" % (FP8_LABEL[n], e), flush=True)
        off = ["%s %.3g" % (FP8_LABEL[n], r[key(n) + "_maxdiff"]) for n in backends
               if (r.get(key(n) + "_maxdiff") or 0) > FP8_MAXDIFF_WARN]
        if off:
            print("      maxdiff against fattn's bf16 O above %.2f: %s" % (FP8_MAXDIFF_WARN, ", ".join(off)), flush=True)
        if a.clocks:
            print("      SM MHz / W (median while running): " + ", ".join(
                "%s %s / %s" % (FP8_LABEL[n], "%.0f" % r[key(n) + "_mhz"] if key(n) + "_mhz" in r else "-",
                                "%.0f" % r[key(n) + "_w"] if key(n) + "_w" in r else "-") for n in backends), flush=True)
    out["elapsed_s"] = round(time.perf_counter() - T0)
    print()
    print("largest |O - fattn's bf16 O| per backend: " + ", ".join(
        "%s %s" % (FP8_LABEL[n], "%.3g" % m if m is not None else "n/a") for n, m in
        ((n, max((r[key(n) + "_maxdiff"] for r in out["results"] if r.get(key(n) + "_maxdiff") is not None),
                 default=None)) for n in backends if n != "fattn")))
    for hdr_, n, dn in ratios:
        xs = [v for v in (fp8_ratio(r, n, dn) for r in out["results"]) if v]
        if xs:
            print("%-10s over %2d rows: %.3f-%.3f, geometric mean %.3f" % (
                hdr_, len(xs), min(xs), max(xs), math.exp(sum(math.log(x) for x in xs) / len(xs))))
        else:
            print("%-10s: no row has both" % hdr_)
    print("done in %.0f s (estimate %.0f s)" % (out["elapsed_s"], est))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


# ------------------------------------------------------------------ backward rows (--bwd)

BWD_BACKENDS = ("fattn", "cudnn", "fa2", "fa4")
BWD_LABEL = {"fattn": "fattn", "cudnn": "cuDNN", "fa2": "FA2", "fa4": "FA4"}
# ratio columns of the backward table: (header, denominator); the numerator is fattn's backward
BWD_RATIOS = (("x cuDNN", "cudnn"), ("x FA2", "fa2"), ("x FA4", "fa4"))
BWD_FLOPS = 2.5  # backward FLOPs / forward FLOPs (DESIGN.md §7: five GEMMs of the forward's size against two)
# max |dX - the reference's dX| / max |reference dX| over dQ, dK, dV: two correct bf16 backwards differ by
# about 1e-2 of the largest gradient (accumulation order, dQ's atomics); a wrong mask or scale by 0.1 and
# more.  A first guess: calibrate it on the device
BWD_MAXDIFF_WARN = 0.05


def load_fa4():
    """FlashAttention-4's interface (package flash-attn-4, module flash_attn.cute; on SM90 its Hopper
    kernels): (flash_attn_func, version), or (None, why not)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # ImportError, or the CuTe DSL failing to load against this torch or driver
        return None, "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:160])
    from importlib.metadata import version
    for dist in ("flash-attn-4", "fa4"):  # the PyPI name; the source tree's __init__ asks for "fa4"
        try:
            return flash_attn_func, "flash-attn-4 " + version(dist)
        except Exception:
            pass
    v = getattr(sys.modules.get("flash_attn.cute"), "__version__", None)
    return flash_attn_func, "flash_attn.cute %s" % (v or "(version unknown)")


def first(r):
    """O of a call that returns O or (O, LSE, ...)."""
    return r[0] if isinstance(r, (tuple, list)) else r


def bwd_args(q, k, v, o, dout, dq, dk, dv, lse, causal, deterministic=False):
    """fattn_bwd's argument struct (python/fattn/_capi.py's BwdArgs, filled as _core.run_bwd fills it) for
    [b, s, h, d] tensors with the head dim contiguous and float32 lse [b, h, s]; softmax scale 1/sqrt(d).
    Built once for a timing loop and run with ctx.bwd_raw.  The struct holds pointers: it keeps the
    tensors alive."""
    from fattn import _capi, _core
    ds = [_core.describe(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (dout, "dout"), (dq, "dq"),
                                            (dk, "dk"), (dv, "dv"))]
    for x in ds:
        if x.c_strides is None:
            raise ValueError("fattn: %s's layout %s with strides %s is not [b, s, h, d] with d contiguous"
                             % (x.name, x.shape, x.strides))
    a = _capi.BwdArgs()
    a.p = _core.problem(_core.check_shapes(ds[0].shape, ds[1].shape, ds[2].shape), causal, 0.0)
    a.q, a.k, a.v, a.o, a.dout, a.dq, a.dk, a.dv = (_core.tensor_struct(x) for x in ds)
    a.lse = lse.data_ptr()
    a.deterministic = int(bool(deterministic))
    a._keep = (q, k, v, o, dout, dq, dk, dv, lse)
    return a


class BwdCase:
    """One shape of the backward table: Q, K, V and dO ~ N(0, 1) [b, s, h, d] (the seed's generator on
    `device`; Q, K, V require grad) and, per backend of `backends`, a forward and a backward call:
    fwd[name] and bwd[name] are (fn, what fn runs under: None or the SDPA backend); a backend whose set-up
    fails is in errors[name] instead.
    fattn: forward fattn_fwd into O and LSE of its own (ctx.fwd_raw); backward fattn_bwd alone
      (ctx.bwd_raw) on the O and LSE of one forward run here, into dQ, dK, dV allocated here, so the timed
      calls hold no forward and no allocation; with deterministic also fattn-det, the same with
      fattn_bwd_args.deterministic = 1, into dQ, dK, dV of its own.
    cudnn, fa2 (torch SDPA on [b, h, s, d] views) and fa4 (flash_attn.cute.flash_attn_func): forward the call
      with grad on (it saves what its backward reads, LSE included, as a training step's forward does);
      backward torch.autograd.grad(O, (q, k, v), dO, retain_graph=True) on the graph of one forward run
      here: the backend's backward kernels with the small passes it runs around them (D = rowsum(dO * O),
      a float32 dQ accumulator's zeroing and conversion), never its forward.
    grads(name, r): (dQ, dK, dV) of bwd[name]'s call that returned r.  The object owns the tensors and
    graphs the calls use: keep it alive while calling them.  device "cpu" (with a CPU context) builds the
    same calls on the CPU engine and torch's CPU kernels, to check this code on a machine without a GPU."""

    def __init__(self, ctx, dtype, b, s, h, d, causal, seed, backends, fa4=None, deterministic=False,
                 device="cuda"):
        g = torch.Generator(device=device).manual_seed(seed)
        self.q, self.k, self.v, self.dout = (torch.randn(b, s, h, d, device=device, dtype=dtype, generator=g)
                                             for _ in range(4))
        for x in (self.q, self.k, self.v):
            x.requires_grad_(True)
        if self.q.is_cuda:
            ctx.set_stream(torch.cuda.current_stream().cuda_stream)
        self.causal = bool(causal)
        self.fwd, self.bwd, self.errors, self.out, self.fattn_grads = {}, {}, {}, {}, {}
        for name in backends:
            try:
                if name == "fattn":
                    self.make_fattn(ctx, deterministic)
                else:
                    self.make_torch(name, fa4)
            except Exception as e:  # noqa: BLE001 - the row records it
                self.errors[name] = e

    def make_fattn(self, ctx, deterministic):
        q, k, v, dout = (x.detach() for x in (self.q, self.k, self.v, self.dout))  # the same storage
        b, s, h, _ = q.shape

        def lse():
            return torch.empty(b, h, s, device=q.device, dtype=torch.float32)
        self.o, self.lse = torch.empty_like(q), lse()
        ctx.fwd_raw(ctx.fwd_args(q, k, v, self.o, self.lse, self.causal))  # what the backward reads
        self.out["fattn"] = torch.empty_like(q)
        fargs = ctx.fwd_args(q, k, v, self.out["fattn"], lse(), self.causal)
        self.fwd["fattn"] = (lambda: ctx.fwd_raw(fargs), None)
        for name, det in (("fattn", False), ("fattn-det", True))[:2 if deterministic else 1]:
            gs = self.fattn_grads[name] = tuple(torch.empty_like(x) for x in (q, k, v))
            self.bwd[name] = (self.fattn_bwd_call(ctx, bwd_args(q, k, v, self.o, dout, *gs, self.lse, self.causal,
                                                                det)), None)

    @staticmethod
    def fattn_bwd_call(ctx, args):
        return lambda: ctx.bwd_raw(args)

    def make_torch(self, name, fa4):
        q, k, v = self.q, self.k, self.v
        if name in ("cudnn", "fa2"):
            be = SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views, as SDPA takes them

            def fwd():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=self.causal)
            dout = self.dout.transpose(1, 2)
        elif name == "fa4":
            if fa4 is None:
                raise RuntimeError("FA4 not loaded")
            be, dout, scale = None, self.dout, q.shape[-1] ** -0.5

            def fwd():  # keywords only: the interface has grown positional parameters (qv, ...) before them
                return first(fa4(q, k, v, softmax_scale=scale, causal=self.causal))
        else:
            raise ValueError(name)
        with turn_context(be):
            o = fwd()  # the graph the timed backward calls run on (FA4 compiles its kernels here)
        self.out[name] = o.transpose(1, 2) if name in ("cudnn", "fa2") else o
        self.fwd[name] = (fwd, be)
        self.bwd[name] = (lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), None)

    def grads(self, name, r):
        return self.fattn_grads[name] if name in self.fattn_grads else r


def grad_maxdiff(gs, ref):
    """max over dQ, dK, dV of max |g - ref| / max |ref|."""
    return max(float((g.float() - r.float()).abs().max().item() / max(r.float().abs().max().item(), 1e-30))
               for g, r in zip(gs, ref))


def short_error(e, n=160):
    return (str(e).splitlines() or [type(e).__name__])[0][:n]


def bench_bwd_case(ctx, dtype, b, s, h, d, causal, a, backends, fa4=None, device="cuda"):
    """One backward row: each backend's backward once (fattn's UNSUPPORTED recorded as <name>_bwd_unsupported,
    another failure as <name>_bwd_error; neither is timed), its gradients against the first backend's that ran
    (fattn's when it runs; grad_reference names it), fattn-det twice (bitwise equal?), each forward once
    (O against fattn's); then every backward and forward takes turns as in bench_case, a backward counting
    BWD_FLOPS x the forward's FLOPs."""
    t_row = time.perf_counter()
    case = BwdCase(ctx, dtype, b, s, h, d, causal, 1234 + s + d, backends, fa4, a.bwd_deterministic, device)
    fl = flops(b, h, s, s, d, causal)
    res = {"dtype": str(dtype).split(".")[-1], "batch": b, "seqlen": s, "heads": h, "head_dim": d,
           "causal": bool(causal), "flops_fwd": fl, "flops_bwd": BWD_FLOPS * fl}
    for name, e in case.errors.items():
        for n in (name + "-bwd", name):
            res[key(n)], res[key(n) + "_error"] = None, short_error(e)
    fns, fl_of, ref = [], {}, None
    names = [n for n in backends if n in case.bwd]
    if "fattn-det" in case.bwd:
        names.insert(names.index("fattn") + 1, "fattn-det")
    for name in names:
        fn, be = case.bwd[name]
        n = name + "-bwd"
        try:
            with turn_context(be):
                r = fn()
            if device == "cuda":
                torch.cuda.synchronize()
        except fattn.FattnUnsupportedError as e:  # a head dim (or all) the CUDA backward does not serve yet
            res[key(n)], res[key(n) + "_unsupported"] = None, short_error(e, 200)
            continue
        except Exception as e:  # noqa: BLE001 - a peer that cannot run this shape: said, and the row goes on
            res[key(n)], res[key(n) + "_error"] = None, short_error(e)
            continue
        gs = [x.detach().clone() for x in case.grads(name, r)]
        if ref is None:
            ref, res["grad_reference"] = gs, name
        else:
            res[key(n) + "_grad_maxdiff"] = grad_maxdiff(gs, ref)
        if name == "fattn-det":  # deterministic = bitwise-reproducible: a second call must give the same bits
            fn()
            res["fattn_det_bitwise"] = all(torch.equal(x, y) for x, y in zip(gs, case.grads(name, None)))
        fns.append((n, fn, be))
        fl_of[n] = BWD_FLOPS * fl
    if not a.bwd_no_fwd:
        for name in [n for n in backends if n in case.fwd]:
            fn, be = case.fwd[name]
            try:
                with turn_context(be):
                    fn()
                if device == "cuda":
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                res[key(name)], res[key(name) + "_error"] = None, short_error(e)
                continue
            if name != "fattn" and hasattr(case, "o"):  # against the O of fattn's set-up forward
                try:
                    res[key(name) + "_maxdiff"] = float((case.out[name].detach().float() -
                                                         case.o.float()).abs().max().item())
                except Exception:  # noqa: BLE001 - an output this script cannot read: timed all the same
                    res[key(name) + "_maxdiff"] = None
            fns.append((name, fn, be))
            fl_of[name] = fl
    ref = gs = r = None  # the set-up's gradients: not held while timing
    if fns:
        take_turns(res, fns, fl_of, a.iters, a.rounds, a.order == "rotate", a.settle_ms, a.cooldown_ms)
    for _, den in BWD_RATIOS:
        res["bwd_fattn_over_" + den] = bwd_ratio(res, den)
    if res.get("fattn_det_bwd") and res.get("fattn_bwd"):
        res["det_over_default"] = res["fattn_det_bwd"] / res["fattn_bwd"]  # throughput; < 1: determinism costs
    del case
    res["row_s"] = round(time.perf_counter() - t_row, 2)
    return res


def bwd_ratio(r, den, num="fattn"):
    """num's backward TFLOPs/s over den's, None unless both ran."""
    x, y = r.get(key(num) + "_bwd"), r.get(key(den) + "_bwd")
    return x / y if x and y else None


def bwd_cell(r, n, width):
    """TFLOPs/s of entry n in a column `width` wide: the figure, 'unsupported' (fattn_bwd said so) or n/a."""
    v = r.get(key(n))
    if v:
        return "%*.1f" % (width, v)
    return ("unsupported" if r.get(key(n) + "_unsupported") else "n/a").rjust(width)


def geomean_line(what, xs):
    if not xs:
        return "%s: no row has both" % what.rstrip()
    return "%s over %2d rows: %.3f-%.3f, geometric mean %.3f" % (
        what, len(xs), min(xs), max(xs), math.exp(sum(math.log(x) for x in xs) / len(xs)))


def main_bwd(a, ap):
    """--bwd: each backend's backward alone and its forward alone, taking turns per row; fattn's backward
    ratios per row and over the rows; with --bwd-deterministic also fattn_bwd with deterministic = 1."""
    for opt, given in (("--fp8", a.fp8), ("--ablation", a.ablation), ("--fattn-lib-b", a.fattn_lib_b),
                       ("--ab-option", a.ab_option), ("--png", a.png)):
        if given:
            ap.error("%s is not available with --bwd" % opt)
    backends = a.backends.split(",") if a.backends else list(BWD_BACKENDS)
    bad = [n for n in backends if n not in BWD_BACKENDS]
    if bad or not backends or len(set(backends)) != len(backends):
        ap.error("--backends with --bwd: %s (from %s, once each)" % (",".join(bad) or "a name twice",
                                                                     ",".join(BWD_BACKENDS)))
    if a.bwd_deterministic and "fattn" not in backends:
        ap.error("--bwd-deterministic times fattn: put fattn in --backends")
    causals = [False, True] if a.causal == "both" else [a.causal == "1"]
    rows = [(dn, d, causal, s, max(1, a.tokens // s), a.hidden // d) for dn in a.dtypes.split(",")
            for d in [int(x) for x in a.head_dims.split(",")] for causal in causals
            for s in [int(x) for x in a.seqlens.split(",")]]
    bad = sorted({r[0] for r in rows} - {"bf16", "fp16"})
    if bad:
        ap.error("--dtypes: %s (bf16, fp16)" % ",".join(bad))
    fa4, fa4_info = (None, "not in --backends") if "fa4" not in backends or a.dry_run else (
        load_fa4() if torch is not None else (None, "torch is not importable"))
    est = estimate_bwd_s(rows, backends, a, fa4_ok=fa4 is not None or a.dry_run)  # a dry run counts FA4 in
    print("%d backward rows (%s; d %s; seqlen %s; causal %s; batch = %d / seqlen, heads = %d / d) x backends %s%s, "
          "backward%s, x %d rounds x (settle %.0f ms + %d x 10 calls): expected ~%.0f s (%.1f min)" % (
              len(rows), a.dtypes, a.head_dims, a.seqlens, a.causal, a.tokens, a.hidden, ",".join(backends),
              " + fattn deterministic" if a.bwd_deterministic else "", "" if a.bwd_no_fwd else " and forward",
              a.rounds, a.settle_ms, a.iters, est, est / 60))
    if "fa4" in backends and (fa4 is not None or a.dry_run):
        print("  FA4 compiles its kernels on first use (CuTe DSL): counted as %.0f s per dtype, head dim and mask, "
              "a guess" % EST_FA4_COMPILE_S)
    if est > 540:
        print("  over 9 minutes: one device command may run 10; split it with --causal, --head-dims or --seqlens")
    if a.dry_run:
        return
    if IMPORT_ERROR is not None:
        sys.exit("compare.py: %s (torch and the fattn library are needed; --dry-run runs without)" % IMPORT_ERROR)
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    init_clocks(a)
    if a.no_pdl:
        ctx.set_option(fattn.OPTION_DISABLE_PDL, 1)
    engine = fattn_engine(ctx)
    print("device: %s, torch %s, cuDNN %s, fattn %s (%s); backend order %s, settle %.0f ms, cool-down %.0f ms "
          "per turn" % (torch.cuda.get_device_name(), torch.__version__, torch.backends.cudnn.version(),
                        fattn.__version__, fattn.library_path, a.order, a.settle_ms, a.cooldown_ms))
    if "fa4" in backends:
        print("FA4: %s" % (fa4_info if fa4 is not None else "n/a (%s); its columns read n/a" % fa4_info))
    print("backward: fattn_bwd alone on the O and LSE of one fattn forward (%s); cuDNN, FA2 (torch SDPA) and FA4: "
          "torch.autograd.grad(O, (q, k, v), dO,\nretain_graph=True) on one forward's graph. forward: fattn_fwd; "
          "the others with grad on (saving LSE). FLOPs: forward 4 b h s^2 d (halved causal), backward %.1f x "
          "that" % ("deterministic 0" + (" and 1" if a.bwd_deterministic else ""), BWD_FLOPS))
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "fattn_version": fattn.__version__,
           "fattn_library": fattn.library_path, "fattn_engine": engine, "bwd": True, "bwd_flops_factor": BWD_FLOPS,
           "bwd_deterministic": a.bwd_deterministic, "fwd_timed": not a.bwd_no_fwd, "pdl": not a.no_pdl,
           "backends": backends, "fa4_version": fa4_info if fa4 else None,
           "fa4_unavailable": None if fa4 or "fa4" not in backends else fa4_info, "order": a.order,
           "rounds": a.rounds, "iters": a.iters, "settle_ms": a.settle_ms, "cooldown_ms": a.cooldown_ms,
           "estimate_s": round(est), "results": []}
    ratios = [(hdr_, den) for hdr_, den in BWD_RATIOS if den in backends and "fattn" in backends]
    fw = {n: 11 if n == "fattn" else 7 for n in backends}  # fattn's cell may read 'unsupported'
    segs = [("backward TFLOPs/s", " ".join("%*s" % (fw[n], BWD_LABEL[n]) for n in backends))]
    if ratios:
        segs.append(("fattn bwd /", " ".join("%8s" % h for h, _ in ratios)))
    if not a.bwd_no_fwd:
        segs.append(("forward TFLOPs/s", " ".join("%7s" % BWD_LABEL[n] for n in backends)))
    lead = "%-5s %4s %-6s %6s" % ("dtype", "d", "mask", "seqlen")
    hdr = lead + "".join(" | " + s for _, s in segs)
    print("\n" + " " * len(lead) + "".join(" | " + t.center(len(s)) for t, s in segs) + "\n" + hdr + "\n" +
          "-" * len(hdr))
    errors_seen = set()
    for dn, d, causal, s, b, h in rows:
        r = bench_bwd_case(ctx, dts[dn], b, s, h, d, causal, a, backends, fa4)
        out["results"].append(r)
        out["elapsed_s"] = round(time.perf_counter() - T0)
        if a.json:  # after every row, so a command stopped at its time limit keeps the rows it measured
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        cells = [" ".join(bwd_cell(r, n + "-bwd", fw[n]) for n in backends)]
        if ratios:
            cells.append(" ".join(fmt(bwd_ratio(r, den), "%8.3f") for _, den in ratios))
        if not a.bwd_no_fwd:
            cells.append(" ".join(fmt(r.get(key(n))) for n in backends))
        print("%-5s %4d %-6s %6d" % (dn, d, "causal" if causal else "none", s) + "".join(" | " + c for c in cells),
              flush=True)
        if a.bwd_deterministic:
            v, v0 = r.get("fattn_det_bwd"), r.get("fattn_bwd")
            if v:
                print("      deterministic: %.1f TFLOPs/s, %s; bitwise repeat %s; max relative "
                      "difference from the default's dQ, dK, dV %s" % (
                    v, "%.3f x the default's throughput (%+.1f%% time)" % (v / v0, 100 * (v0 / v - 1)) if v0 else
                    "the default n/a", "yes" if r.get("fattn_det_bitwise") else "NO",
                    "%.3g" % r["fattn_det_bwd_grad_maxdiff"] if r.get("fattn_det_bwd_grad_maxdiff") is not None
                    else "n/a"), flush=True)
            else:
                print("      deterministic: %s" % ("unsupported" if r.get("fattn_det_bwd_unsupported") else "n/a"),
                      flush=True)
        for n in [n + "-bwd" for n in backends] + (["fattn-det-bwd"] if a.bwd_deterministic else []) + list(backends):
            for what in ("_unsupported", "_error"):
                e = r.get(key(n) + what)
                if e and (n.replace("-bwd", ""), e) not in errors_seen:  # each backend's distinct message once
                    errors_seen.add((n.replace("-bwd", ""), e))
                    print("      %s%s: %s" % (n, " (unsupported)" if what == "_unsupported" else "", e), flush=True)
        off = ["%s %.3g" % (n, r[key(n) + "_grad_maxdiff"]) for n in
               [n + "-bwd" for n in backends] + ["fattn-det-bwd"] if (r.get(key(n) + "_grad_maxdiff") or 0) >
               BWD_MAXDIFF_WARN]
        off += ["%s O %.3g" % (n, r[key(n) + "_maxdiff"]) for n in backends
                if (r.get(key(n) + "_maxdiff") or 0) > MAXDIFF_WARN]
        if off:
            print("      above the warning level (dQ, dK, dV against %s's, relative %.2f; O against fattn's %.2f): %s"
                  % (r.get("grad_reference"), BWD_MAXDIFF_WARN, MAXDIFF_WARN, ", ".join(off)), flush=True)
        if a.clocks:
            names = [n + "-bwd" for n in backends] + (["fattn-det-bwd"] if a.bwd_deterministic else []) + (
                [] if a.bwd_no_fwd else list(backends))
            print("      SM MHz / W (median while running): " + ", ".join(
                "%s %s / %s" % (n, "%.0f" % r[key(n) + "_mhz"] if key(n) + "_mhz" in r else "-",
                                "%.0f" % r[key(n) + "_w"] if key(n) + "_w" in r else "-") for n in names), flush=True)
    out["elapsed_s"] = round(time.perf_counter() - T0)
    res = out["results"]
    print()
    for n in [n + "-bwd" for n in backends] + (["fattn-det-bwd"] if a.bwd_deterministic else []):
        ms = [(r[key(n) + "_grad_maxdiff"], r["grad_reference"]) for r in res if r.get(key(n) + "_grad_maxdiff")
              is not None]
        if ms:
            m = max(ms)
            print("largest relative |dX - the reference's| of %s: %.3g (against %s)" % (n, m[0], m[1]))
    unsup = [r for r in res if r.get("fattn_bwd_unsupported")]
    if unsup:
        print("fattn_bwd unsupported on %d of %d rows (head dims %s)" % (
            len(unsup), len(res), ",".join(str(d) for d in sorted({r["head_dim"] for r in unsup}))))
    for hdr_, den in ratios:
        print(geomean_line("fattn bwd %-8s" % hdr_, [v for v in (bwd_ratio(r, den) for r in res) if v]))
    if a.bwd_deterministic:
        print(geomean_line("fattn bwd det / default", [r["det_over_default"] for r in res
                                                        if r.get("det_over_default")]))
        nb = [r for r in res if r.get("fattn_det_bwd") and not r.get("fattn_det_bitwise")]
        if nb:
            print("  deterministic but not bitwise repeatable on %d rows" % len(nb))
    print("done in %.0f s (estimate %.0f s)" % (out["elapsed_s"], est))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


# the estimate's assumptions: TFLOPs/s under the power limit (README table; causal 0.8x of it; FP8:
# REFERENCE.md's FA3 FP8 figures, fattn's FP8 not yet measured), start-up (torch, CUDA, cuDNN, the FA3
# extension) and per row (inputs, first calls, maxdiff; FP8 rows also quantise their inputs in torch)
EST_TFLOPS, EST_START_S, EST_ROW_S = {"fa2": 300.0, "fattn-fp8": 750.0, "fa3-fp8": 750.0,
                                      "fattn-fp8-e2e": 750.0}, 30.0, 0.5
EST_ROW_S_FP8 = 1.0
# --bwd: backward TFLOPs/s (guesses, none measured here: FA3's paper has its H100 backward at 1.5-1.75x FA2's),
# set-up per row (inputs, each backend's forward and backward once, the gradients compared) and FA4's
# compilation of its forward and backward kernels per dtype, head dim and mask (a guess)
EST_TFLOPS.update({"fattn-bwd": 450.0, "fattn-det-bwd": 400.0, "cudnn-bwd": 450.0, "fa2-bwd": 270.0,
                   "fa4-bwd": 450.0})
EST_ROW_S_BWD, EST_FA4_COMPILE_S = 2.0, 30.0
EST_QUANT_BPS = 2.5e12  # fattn_fwd_fp8's quantisation: 3 bytes (2 read, 1 written) per input element


def turn_s(name, fl, causal, iters, settle_ms, cooldown_ms, extra_s=0.0):
    """One turn: cool-down, 5 warm-up calls, the settling (half a batch of 10 past it), iters x 10 samples;
    extra_s per call on top of the FLOPs (the e2e quantisation)."""
    t = fl / (EST_TFLOPS.get(name, 520.0) * (0.8 if causal else 1.0) * 1e12) + extra_s
    return (cooldown_ms + settle_ms) / 1e3 + (5 + 5 + 10 * iters) * t


def estimate_s(rows, backends, a, fa3_ok=True):
    """Expected seconds of the run: rows x backends x rounds x (settle + samples), plus start-up."""
    tot = EST_START_S
    names = [n for n in backends if not n.startswith("fa3") or fa3_ok] + (["fattn_ab"] if a.ab_option else [])
    for dn, d, causal, s, b, h in rows:
        fl = flops(b, h, s, s, d, causal)
        quant_s = 3 * b * s * h * d * 3 / EST_QUANT_BPS
        tot += (EST_ROW_S_FP8 if dn == "fp8" else EST_ROW_S) + sum(
            a.rounds * turn_s(n, fl, causal, a.iters, a.settle_ms, a.cooldown_ms,
                              quant_s if n == "fattn-fp8-e2e" else 0.0)
            for n in names if n != "fa3" or dn in ("bf16", "fp8"))
    if a.ablation:  # 4 variants x --ablation-rounds single turns, the peers once
        fl = flops(4, 16, 8448, 8448, 128, False)
        tot += 4 * a.ablation_rounds * (EST_ROW_S + turn_s("fattn", fl, False, a.iters, a.settle_ms, 0)) + sum(
            turn_s(n, fl, False, a.iters, a.settle_ms, 0) for n in names if n not in ("fattn", "fattn-b", "fattn_ab"))
    return tot


def estimate_bwd_s(rows, backends, a, fa4_ok=True):
    """Expected seconds of a --bwd run: rows x (backward and forward entries) x rounds x (settle + samples),
    plus start-up and FA4's compilations."""
    names = [n for n in backends if n != "fa4" or fa4_ok]
    entries = [(n + "-bwd", BWD_FLOPS) for n in names] + ([("fattn-det-bwd", BWD_FLOPS)] if a.bwd_deterministic
                                                          else []) + ([] if a.bwd_no_fwd else [(n, 1.0) for n in names])
    tot = EST_START_S
    for dn, d, causal, s, b, h in rows:
        fl = flops(b, h, s, s, d, causal)
        tot += EST_ROW_S_BWD + sum(a.rounds * turn_s(n, f * fl, causal, a.iters, a.settle_ms, a.cooldown_ms)
                                   for n, f in entries)
    if "fa4" in names:
        tot += EST_FA4_COMPILE_S * len({(dn, d, causal) for dn, d, causal, _, _, _ in rows})
    return tot


def fmt(x, f="%7.1f"):
    return f % x if x else "n/a".rjust(len(f % 0.0))


def ratio(r, den):
    return r["fattn"] / r[key(den)] if r.get(key(den)) else None


def summary(results, ratios, names):
    """Per ratio column: range and geometric mean over the rows; for new/old the rows outside +-2%;
    per backend the largest maxdiff against fattn's output."""
    print()
    worst = [(n, max((r[key(n) + "_maxdiff"] for r in results if r.get(key(n) + "_maxdiff") is not None),
                     default=None)) for n in names if n != "fattn"]
    print("largest |O - fattn's O| per backend: " + ", ".join(
        "%s %s" % (LABEL[n], "n/a" if m is None else "%.3g" % m) for n, m in worst))
    for hdr, den in ratios:
        vals = [(r, ratio(r, den)) for r in results if ratio(r, den)]
        if not vals:
            continue
        xs = [v for _, v in vals]
        print("fattn %-8s over %2d rows: %.3f-%.3f, geometric mean %.3f" % (
            hdr, len(xs), min(xs), max(xs), math.exp(sum(math.log(x) for x in xs) / len(xs))))
        if den == "fattn-b":
            out = ["%s d%d %s %d: %.3f" % (DT.get(r["dtype"], r["dtype"]), r["head_dim"],
                                           "causal" if r["causal"] else "none", r["seqlen"], v)
                   for r, v in vals if abs(v - 1) > 0.02]
            print("  new/old outside 0.98-1.02: %s" % ("; ".join(out) if out else "none"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", choices=sorted(ROWS),
                    help="preset of dtypes, head dims, seqlens and masks (all, the default; table: the forward table's 60 "
                         "rows; smoke: seqlen 1024 only; fp8, the default with --fp8: seqlen 1024, 4096, 16384; "
                         "bwd, the default with --bwd: the table's bf16 rows); "
                         "--dtypes, --head-dims, --seqlens, --causal override it")
    ap.add_argument("--fp8", action="store_true",
                    help="the FP8 table: fattn's FP8 kernel alone (e4m3 inputs, block scales of 128 rows), FA3's "
                         "FP8 kernel alone (per-(batch, kv head) descales), fattn_fwd_fp8 end to end from bf16, "
                         "fattn bf16 and FA3 bf16 (--backends from %s)" % ",".join(FP8_BACKENDS))
    ap.add_argument("--fp8-d128-kv-block", type=int, default=FP8_BLOCK_D128_KV,
                    help="with --fp8: rows per K and V scale of the fattn FP8 rows at head dim 128 (default %d, "
                         "its 128-key kernels; 192: its 192-key ones, run 150)" % FP8_BLOCK_D128_KV)
    ap.add_argument("--bwd", action="store_true",
                    help="the backward table: each backend's backward alone (fattn_bwd on a forward's O and LSE; "
                         "torch.autograd.grad on a forward's graph for the others) and its forward alone, "
                         "TFLOPs/s with 2.5 x the forward's FLOPs (--backends from %s)" % ",".join(BWD_BACKENDS))
    ap.add_argument("--bwd-deterministic", action="store_true",
                    help="with --bwd (implies it): also fattn_bwd with deterministic = 1, its throughput against "
                         "the default's and whether two calls give the same bits")
    ap.add_argument("--bwd-no-fwd", action="store_true", help="with --bwd: time the backwards only")
    ap.add_argument("--dtypes")
    ap.add_argument("--head-dims")
    ap.add_argument("--seqlens")
    ap.add_argument("--causal", choices=["both", "0", "1"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--backends", help="comma-separated, from %s, fattn among them; they take turns in this "
                                       "order (default: fattn,fattn-b (with --fattn-lib-b),cudnn,fa2,fa3)"
                                       % ",".join(BACKENDS))
    ap.add_argument("--fattn-lib-b", metavar="PATH",
                    help="a second libfattn.so (e.g. the previous commit's build) timed as backend fattn-b")
    ap.add_argument("--fattn-py-b", metavar="DIR",
                    help="the python/fattn directory whose bindings load --fattn-lib-b (default: this tree's)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape")
    ap.add_argument("--iters", type=int, default=4, help="samples (of 10 calls) per backend per round")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--ablation-rounds", type=int, default=3, help="interleaved rounds of the ablation")
    ap.add_argument("--order", default="rotate", choices=["rotate", "fixed"],
                    help="backend order per round: rotated (round r starts with backend r) or always the "
                         "--backends order")
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
                    help="launch fattn (and fattn-b) without programmatic dependent launch (its set-up then "
                         "cannot overlap the previous call's tail)")
    ap.add_argument("--fattn-engine", choices=["auto", "hopper", "portable"],
                    help="the CUDA engine fattn's contexts run (sets FATTN_CUDA_ENGINE before they are created; "
                         "default: the variable as the environment has it, else by the GPU's architecture): "
                         "portable times the portable engine on a Hopper GPU")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the rows, the backends and the expected duration, and stop (needs no torch or GPU)")
    ap.add_argument("--variants", action="store_true",
                    help="the attention variants of issue 37 (bench/compare_variants.py): sliding window, softcap, "
                         "learnable sinks, head_dim 192 / head_dim_v 128, fattn beside fattn without the variant and "
                         "the peers that have it (FA3, FA4, cuDNN); forward, or with --bwd the backward "
                         "(--backends from fattn,fattn-plain,cudnn,fa3,fa4)")
    ap.add_argument("--kinds", default="window,softcap,sinks,hd192",
                    help="with --variants: which rows (window,softcap,sinks,hd192)")
    ap.add_argument("--cpu-check", action="store_true",
                    help="with --variants: build every row small on the CPU engine and check fattn's outputs and "
                         "gradients against float64 torch, and the FLOP and tile counts (no GPU)")
    a = ap.parse_args()
    if a.cpu_check and not a.variants:
        ap.error("--cpu-check goes with --variants")
    if a.fattn_engine:  # read by each fattn context at its creation (fattn.h), fattn-b's included
        os.environ["FATTN_CUDA_ENGINE"] = a.fattn_engine
    if os.environ.get("FATTN_CUDA_ENGINE") not in (None, "", "auto"):
        print("FATTN_CUDA_ENGINE=%s: fattn's contexts run that engine (checked once created)"
              % os.environ["FATTN_CUDA_ENGINE"])
    if os.environ.get("FATTN_CUDA_ENGINE") == "portable":  # FlashAttention-2's design: the estimate takes FA2's speeds
        EST_TFLOPS.update({"fattn": EST_TFLOPS["fa2"], "fattn-bwd": EST_TFLOPS["fa2-bwd"],
                           "fattn-det-bwd": 0.9 * EST_TFLOPS["fa2-bwd"]})
    if a.variants:
        sys.modules.setdefault("compare", sys.modules[__name__])  # compare_variants imports this module, not a copy
        import compare_variants
        return compare_variants.cpu_check(a) if a.cpu_check else compare_variants.main_variants(a, ap)
    a.bwd = a.bwd or a.bwd_deterministic
    if a.bwd_no_fwd and not a.bwd:
        ap.error("--bwd-no-fwd goes with --bwd")
    a.rows = a.rows or ("fp8" if a.fp8 else "bwd" if a.bwd else "all")
    preset = dict(zip(("dtypes", "head_dims", "seqlens", "causal"), ROWS[a.rows]))
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.bwd:
        return main_bwd(a, ap)
    if a.fp8:
        return main_fp8(a, ap)
    backends = (a.backends.split(",") if a.backends else
                ["fattn"] + (["fattn-b"] if a.fattn_lib_b else []) + ["cudnn", "fa2", "fa3"])
    bad = [n for n in backends if n not in BACKENDS]
    if bad or "fattn" not in backends or len(set(backends)) != len(backends):
        ap.error("--backends: %s (from %s, once each, fattn among them: every ratio is fattn's)" % (
            ",".join(bad) or "fattn missing or a name twice", ",".join(BACKENDS)))
    if "fattn-b" in backends and not a.fattn_lib_b:
        ap.error("backend fattn-b needs --fattn-lib-b PATH")
    if a.fattn_lib_b and "fattn-b" not in backends:
        print("--fattn-lib-b: fattn-b is not in --backends, so it is not loaded")
    causals = [False, True] if a.causal == "both" else [a.causal == "1"]
    rows = [(dn, d, causal, s, max(1, a.tokens // s), a.hidden // d) for dn in a.dtypes.split(",")
            for d in [int(x) for x in a.head_dims.split(",")] for causal in causals
            for s in [int(x) for x in a.seqlens.split(",")]]
    bad = sorted({r[0] for r in rows} - {"bf16", "fp16"})
    if bad:
        ap.error("--dtypes: %s (bf16, fp16)" % ",".join(bad))

    fa3, fa3_info = (None, "not in --backends") if "fa3" not in backends or a.dry_run else (
        load_fa3() if torch is not None else (None, "torch is not importable"))
    est = estimate_s(rows, backends, a, fa3_ok=fa3 is not None or a.dry_run)  # a dry run counts FA3 in
    note = " (FA3 on the bf16 rows only)" if "fa3" in backends and "fp16" in a.dtypes else ""
    print("%d rows (%s; d %s; seqlen %s; causal %s) x backends %s%s x %d rounds x (settle %.0f ms + %d x 10 calls): "
          "expected ~%.0f s (%.1f min)" % (len(rows), a.dtypes, a.head_dims, a.seqlens, a.causal, ",".join(backends),
                                           note, a.rounds, a.settle_ms, a.iters, est, est / 60))
    if est > 540:
        print("  over 9 minutes: one device command may run 10; split it with --dtypes, --causal or --head-dims")
    if a.dry_run:
        return
    if IMPORT_ERROR is not None:
        sys.exit("compare.py: %s (torch and the fattn library are needed; --dry-run runs without)" % IMPORT_ERROR)
    fb = FattnB(a.fattn_lib_b, a.fattn_py_b) if "fattn-b" in backends else None
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    init_clocks(a)
    if a.no_pdl:
        ctx.set_option(fattn.OPTION_DISABLE_PDL, 1)
        if fb is not None:
            fb.ctx.set_option(fb.mod.OPTION_DISABLE_PDL, 1)
    engine = fattn_engine(ctx)
    print("device: %s, torch %s, cuDNN %s, fattn %s; backend order %s, settle %.0f ms, cool-down %.0f ms per turn" % (
        torch.cuda.get_device_name(), torch.__version__, torch.backends.cudnn.version(), fattn.__version__, a.order,
        a.settle_ms, a.cooldown_ms))
    if fb is not None:
        print("fattn-b: %s (fattn %s)%s" % (fb.path, fb.version, "; the SAME library as fattn (same file or a hard "
              "link, or the bindings ignored FATTN_LIBRARY): an A/A run" if fb.same else ""))
    if fa3 is not None:
        print("FA3: %s%s" % (fa3_info, "; bf16 only: its fp16 rows read n/a" if "fp16" in a.dtypes else ""))
    elif "fa3" in backends:
        print("FA3: n/a (%s); its column reads n/a" % fa3_info)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "fattn_version": fattn.__version__, "fattn_engine": engine,
           "pdl": not a.no_pdl, "backends": backends, "fa3_version": fa3_info if fa3 else None,
           "fa3_unavailable": None if fa3 else fa3_info,
           "fattn_b": None if fb is None else {"library": fb.path, "version": fb.version, "same_as_fattn": fb.same},
           "order": a.order, "rounds": a.rounds, "iters": a.iters, "settle_ms": a.settle_ms,
           "cooldown_ms": a.cooldown_ms, "estimate_s": round(est), "results": [], "ablation": []}
    peer_names = [n for n in backends if n != "fattn-b"]  # the ablation's peers (one fattn library)

    if a.ablation:
        print("\nablation: batch 4, seqlen 8448, 16 heads, head dim 128, bf16, non-causal (TFLOPs/s, median of %d "
              "interleaved rounds)" % a.ablation_rounds)
        # the variants interleaved over the rounds, median per variant: the
        # machine drifts by several percent within a run, and this way the
        # drift hits every variant alike.  The overlap variants run the
        # paper's placement (the softmax under the warpgroup's own PV GEMM),
        # which the shipped d128 kernel also has since v15 (run 35), so "full
        # design" is the shipped kernel; the peers are timed beside it
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
                                             settle_ms=a.settle_ms, backends=peer_names, fa3=fa3))
        for name, _, _, _ in variants:
            r = dict(runs[name][0])
            vals = sorted(x["fattn"] for x in runs[name])
            r["fattn"] = vals[len(vals) // 2]
            r["fattn_rounds"] = [x["fattn"] for x in runs[name]]
            r["variant"] = name
            out["ablation"].append(r)
            extra = "".join("   %s %s" % (LABEL[n], fmt(r.get(key(n)), "%.0f")) for n in peer_names[1:]
                            if key(n) in r)
            print("  %-28s %6.0f  (rounds %s)%s" % (name, r["fattn"], " ".join("%.0f" % v for v in r["fattn_rounds"]),
                                                   extra), flush=True)
        ctx.set_option(fattn.OPTION_DISABLE_OVERLAP, 0)
        ctx.set_option(fattn.OPTION_DISABLE_PINGPONG, 0)
        ctx.set_option(fattn.OPTION_SOFTMAX_UNDER_PV, 0)

    ab_opt = None if a.ab_option is None else getattr(fattn, "OPTION_" + a.ab_option.upper())
    cols = [n for n in BACKENDS if n in backends]
    ratios = [(h, den) for h, den in RATIOS if den in backends]
    hdr = "%-5s %4s %-6s %6s | %s | %s" % ("dtype", "d", "mask", "seqlen", " ".join("%7s" % LABEL[n] for n in cols),
                                          " ".join("%8s" % h for h, _ in ratios))
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for dn, d, causal, s, b, h in rows:
        r = bench_case(ctx, dts[dn], b, s, h, d, causal, a.iters, rounds=a.rounds, rotate=a.order == "rotate",
                       settle_ms=a.settle_ms, cooldown_ms=a.cooldown_ms, ab_option=ab_opt, backends=backends,
                       ctx_b=fb.ctx if fb else None, fa3=fa3)
        out["results"].append(r)
        out["elapsed_s"] = round(time.perf_counter() - T0)
        if a.json:  # after every row, so a command stopped at its time limit keeps the rows it measured
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        print("%-5s %4d %-6s %6d | %s | %s" % (dn, d, "causal" if causal else "none", s,
                                               " ".join(fmt(r.get(key(n))) for n in cols),
                                               " ".join(fmt(ratio(r, den), "%8.3f") for _, den in ratios)), flush=True)
        if ab_opt is not None:
            print("      A/B %s=1: %.1f TFLOPs/s, %.3f x fattn" % (a.ab_option, r["fattn_ab"],
                                                           r["fattn_ab"] / r["fattn"]), flush=True)
        off = ["%s %.3g" % (LABEL[n], r[key(n) + "_maxdiff"]) for n in cols
               if (r.get(key(n) + "_maxdiff") or 0) > MAXDIFF_WARN]
        if off:
            print("      maxdiff against fattn's O above %.2f: %s" % (MAXDIFF_WARN, ", ".join(off)), flush=True)
        if a.clocks:
            print("      SM MHz / W (median while running): " + ", ".join(
                "%s %s / %s" % (n, "%.0f" % r[n + "_mhz"] if n + "_mhz" in r else "-",
                                "%.0f" % r[n + "_w"] if n + "_w" in r else "-")
                for n in [key(n) for n in cols] + (["fattn_ab"] if ab_opt is not None else [])), flush=True)
    out["elapsed_s"] = round(time.perf_counter() - T0)
    summary(out["results"], ratios, cols)
    print("done in %.0f s (estimate %.0f s)" % (out["elapsed_s"], est))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.png and out["results"]:
        plot(out["results"], a.png)


def plot(results, path):
    try:
        import matplotlib
    except ImportError:
        print("--png: matplotlib is not installed; no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dims = sorted({r["head_dim"] for r in results})
    masks = sorted({r["causal"] for r in results})
    dtypes = sorted({r["dtype"] for r in results})
    fig, axes = plt.subplots(len(masks) * len(dtypes), len(dims), figsize=(5 * len(dims), 3.6 * len(masks) * len(dtypes)),
                             squeeze=False)
    lines = [(k, label) for k, label in (("fattn", "fattn"), ("fattn_b", "fattn-b (--fattn-lib-b)"),
                                         ("cudnn", "cuDNN (torch SDPA)"), ("fa2", "FA2 (torch SDPA)"),
                                         ("fa3", "FA3 (fa3-fwd)")) if any(r.get(k) for r in results)]
    for i, (dt, m) in enumerate([(dt, m) for dt in dtypes for m in masks]):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            rs = sorted([r for r in results if r["dtype"] == dt and r["causal"] == m and r["head_dim"] == d],
                        key=lambda r: r["seqlen"])
            xs = [r["seqlen"] for r in rs]
            for k, label in lines:
                ys = [r.get(k) or float("nan") for r in rs]
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
