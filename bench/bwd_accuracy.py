#!/usr/bin/env python3
"""bwd_accuracy.py - the backward's error next to its peers' (issue 24: fattn's error no worse
than 2x cuDNN's): dQ, dK, dV of fattn, torch SDPA's cuDNN backend and torch SDPA's
FlashAttention-2 backend, each against an FP64 reference computed on the GPU from the same
16-bit inputs.

    FATTN_LIBRARY=build/libfattn.so python3 bench/bwd_accuracy.py [--head-dims 64,128,256]
        [--seqlens 1024,4096] [--causal both|0|1] [--batch 2] [--heads 8] [--dtype bf16|fp16]
        [--impls fattn,cudnn,fa2] [--deterministic] [--max-ratio 2] [--seed N] [--json PATH]
        [--device cuda|cpu]

Inputs: q, k, v, dO ~ N(0, 1) [batch, seqlen, heads, head_dim] in --dtype (a fixed seed per shape),
softmax scale 1/sqrt(head_dim), seqlen_q = seqlen_k.  Implementations, all through torch autograd
(torch.autograd.grad(O, (q, k, v), dO)), as a training step calls them:
  fattn   fattn.flash_attn_func (python/fattn: fattn_fwd, then fattn_bwd on its O and LSE)
  cudnn   F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
  fa2     F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION)
Reference: float64 on the device from the same 16-bit values: S = scale q k^T (causal: key j
visible to query i iff j <= i + seqlen_k - seqlen_q), P = softmax(S), O = P V, dV = P^T dO,
dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q.
Error: |g - g*|_F / |g*|_F per tensor.  Ratio: fattn's error / cuDNN's, per tensor; a row fails
when a ratio exceeds --max-ratio (2).  A peer that raises for a shape (say cuDNN at d256) is
reported with its reason and that row has no ratio; fattn answering UNSUPPORTED for a shape (a head
dim the kernel lacks) is reported the same way and is not a failure.
Exit status: 0 every ratio within --max-ratio; 1 a ratio above it, or fattn failing otherwise
than UNSUPPORTED; 2 fattn's CUDA backward missing altogether (a small d64 call answers
UNSUPPORTED), torch or fattn not importable, or no CUDA device.  --device cpu runs the same code
on fattn's CPU engine and torch's CPU kernels (cuDNN's row then reports that it cannot run, and
FA2's is torch's CPU flash kernel): a check of this script on a machine without a GPU, not a
measurement.
--json PATH writes the numbers: one entry per shape with each implementation's errors (or its
error message) and the ratios.
"""
import argparse
import json
import math
import os
import sys
import time

IMPLS = ("fattn", "cudnn", "fa2")
LABEL = {"fattn": "fattn", "cudnn": "cuDNN", "fa2": "FA2"}
DEFAULT_SEED = 20240527  # tests/common/testutil.h's TU_DEFAULT_SEED
GRADS = ("dq", "dk", "dv")


def int_list(s):
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers, got %r" % s)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dims", type=int_list, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=int_list, default=[1024, 4096])
    ap.add_argument("--causal", choices=("both", "0", "1"), default="both")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="comma-separated subset of %s (default: all)" % ",".join(IMPLS))
    ap.add_argument("--deterministic", action="store_true",
                    help="fattn's backward with deterministic = 1 (flash_attn_func(deterministic=True))")
    ap.add_argument("--max-ratio", type=float, default=2.0,
                    help="fail a row whose fattn / cuDNN error ratio exceeds this (issue 24: 2)")
    ap.add_argument("--seed", type=int, default=None, help="base seed (default: FATTN_TEST_SEED, else %d)"
                    % DEFAULT_SEED)
    ap.add_argument("--json", metavar="PATH", help="write the numbers here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args(argv)
    a.impls = [x for x in a.impls.split(",") if x]
    bad = [x for x in a.impls if x not in IMPLS]
    if bad or not a.impls:
        ap.error("--impls: unknown %s (known: %s)" % (",".join(bad) or "(none given)", ",".join(IMPLS)))
    for name, xs in (("--head-dims", a.head_dims), ("--seqlens", a.seqlens)):
        if not xs or any(x < 1 for x in xs):
            ap.error("%s: positive integers, got %s" % (name, xs))
    if a.batch < 1 or a.heads < 1:
        ap.error("--batch and --heads must be >= 1")
    if not a.max_ratio > 0:
        ap.error("--max-ratio must be > 0")
    a.causals = {"both": [False, True], "0": [False], "1": [True]}[a.causal]
    if a.seed is None:
        env = os.environ.get("FATTN_TEST_SEED", "")
        a.seed = int(env, 0) & 0x7FFFFFFF if env and env != "random" else DEFAULT_SEED
    return a


def die(msg, code=2):
    print("bwd_accuracy: %s" % msg, file=sys.stderr)
    print("bwd_accuracy: FAILED: %s" % msg)
    sys.exit(code)


def short(e, n=200):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, (text.splitlines() or [""])[0][:n])


def reference(q, k, v, dout, causal, scale):
    """(dq, dk, dv) in float64 from the 16-bit tensors [b, s, h, d], one batch element at a time
    (the [h, s, s] float64 matrices of s 4096, h 8 are 1 GiB each)."""
    import torch
    out = [torch.empty(x.shape, dtype=torch.float64, device=x.device) for x in (q, k, v)]
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j > i + sk - sq
    for b in range(q.shape[0]):
        q64, k64, v64, do64 = (x[b].double().transpose(0, 1) for x in (q, k, v, dout))  # [h, s, d]
        s = (q64 @ k64.transpose(-1, -2)) * scale
        if mask is not None:
            s.masked_fill_(mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num_(0.0)  # rows that see no key: P = 0
        del s
        o = p @ v64
        dv = p.transpose(-1, -2) @ do64
        dp = do64 @ v64.transpose(-1, -2)
        dsum = (do64 * o).sum(-1, keepdim=True)
        ds = p * (dp - dsum)
        del dp, p
        dq = (ds @ k64) * scale
        dk = (ds.transpose(-1, -2) @ q64) * scale
        del ds
        for dst, g in zip(out, (dq, dk, dv)):
            dst[b] = g.transpose(0, 1)
    return out


def rel_err(g, ref):
    g = g.double()
    if not bool(g.isfinite().all()):
        return math.inf
    den = ref.norm().item()
    num = (g - ref).norm().item()
    return num / den if den > 0 else num


def grads_fattn(fattn, q, k, v, dout, causal, deterministic):
    import torch
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = fattn.flash_attn_func(qq, kk, vv, causal=causal, deterministic=deterministic)
    return torch.autograd.grad(o, (qq, kk, vv), dout)


def grads_sdpa(backend, q, k, v, dout, causal):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                           is_causal=causal)  # seqlen_q = seqlen_k: either alignment
        gs = torch.autograd.grad(o, (qq, kk, vv), dout.transpose(1, 2))
    return gs


def probe(fattn, torch, dtype, device):
    """A small d64 backward on the device: None when it runs, else why not (UNSUPPORTED: fattn has no
    CUDA backward; anything else: a failure)."""
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v, dout = (torch.randn(1, 128, 2, 64, device=device, dtype=dtype, generator=g) for _ in range(4))
    try:
        grads_fattn(fattn, q, k, v, dout, False, False)
        return None, False
    except fattn.FattnUnsupportedError as e:
        return short(e, 400), True
    except Exception as e:  # noqa: BLE001 - reported, then the script stops
        return short(e, 400), False


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
        from torch.nn.attention import SDPBackend
    except ImportError as e:
        die("torch is not importable (%s)" % e)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    try:
        import fattn
    except Exception as e:  # noqa: BLE001 - OSError when libfattn.so is missing, ImportError ...
        die("the fattn package did not load (%s); set FATTN_LIBRARY to a libfattn.so" % short(e, 400))
    if a.device == "cuda" and not torch.cuda.is_available():
        die("no CUDA device (torch.cuda.is_available() is False); --device cpu checks the script on the CPU")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    dev = a.device
    if "fattn" in a.impls:
        why, unsupported = probe(fattn, torch, dtype, dev)
        if why is not None:
            die("fattn's %s backward %s: %s" % ("CUDA" if dev == "cuda" else "CPU",
                                                "is unsupported" if unsupported else "failed", why),
                2 if unsupported else 1)
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
    info = {"torch": torch.__version__, "fattn": getattr(fattn, "__version__", "?"),
            "library": getattr(fattn, "library_path", "?"), "device": dev, "dtype": a.dtype, "seed": a.seed,
            "deterministic": a.deterministic, "max_ratio": a.max_ratio}
    if dev == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cudnn"] = torch.backends.cudnn.version()
    print("torch %s, fattn %s (%s), %s%s, seed %d" % (info["torch"], info["fattn"], info["library"],
          info.get("gpu", dev), ", cuDNN %s" % info["cudnn"] if dev == "cuda" else "", a.seed))
    print("relative Frobenius error |g - g*|_F / |g*|_F against float64; ratio = fattn / cuDNN (fails above %.3g)"
          % a.max_ratio)
    print("%-32s %-6s %10s %10s %10s" % ("shape", "impl", "dq", "dk", "dv"))
    rows, fails, unsupported, no_ratio = [], 0, [], []
    t0 = time.perf_counter()
    for d in a.head_dims:
        for s in a.seqlens:
            for causal in a.causals:
                shape = "%s b%d s%d h%d d%d%s" % (a.dtype, a.batch, s, a.heads, d, " causal" if causal else "")
                seed = a.seed + 7919 * s + 31 * d + int(causal)
                g = torch.Generator(device=dev).manual_seed(seed)
                q, k, v, dout = (torch.randn(a.batch, s, a.heads, d, device=dev, dtype=dtype, generator=g)
                                 for _ in range(4))
                ref = reference(q, k, v, dout, causal, 1.0 / math.sqrt(d))
                row = {"batch": a.batch, "seqlen": s, "heads": a.heads, "head_dim": d, "causal": causal,
                       "seed": seed}
                for name in a.impls:
                    try:
                        if name == "fattn":
                            gs = grads_fattn(fattn, q, k, v, dout, causal, a.deterministic)
                        else:
                            gs = grads_sdpa(backends[name], q, k, v, dout, causal)
                        errs = {n: rel_err(x, r) for n, x, r in zip(GRADS, gs, ref)}
                        row[name] = errs
                        del gs
                        cells = ["%10.3e" % errs[n] for n in GRADS]
                    except Exception as e:  # noqa: BLE001 - the row records why
                        is_unsup = name == "fattn" and isinstance(e, fattn.FattnUnsupportedError)
                        row[name] = {"error": short(e, 400), "unsupported": is_unsup}
                        if name == "fattn":
                            if is_unsup:
                                unsupported.append((shape, short(e)))
                            else:
                                fails += 1
                        cells = ["%-32s" % ("unsupported" if is_unsup else "error: " + short(e, 60))]
                    print(("%-32s %-6s %s" % (shape if name == a.impls[0] else "", LABEL[name], " ".join(cells))).rstrip())
                f, c = row.get("fattn"), row.get("cudnn")
                if f is not None and c is not None and "error" not in f and "error" not in c:
                    ratio = {n: (f[n] / c[n] if c[n] > 0 else math.inf) for n in GRADS}
                    row["ratio_fattn_cudnn"] = ratio
                    ok = all(r <= a.max_ratio for r in ratio.values())
                    row["ok"] = ok
                    fails += not ok
                    print("%-32s %-6s %s %s" % ("", "ratio", " ".join("%10.2f" % ratio[n] for n in GRADS),
                                                "ok" if ok else "FAIL (> %.3g)" % a.max_ratio))
                elif "fattn" in a.impls and "cudnn" in a.impls:
                    no_ratio.append(shape)
                rows.append(row)
                del q, k, v, dout, ref
                sys.stdout.flush()
    elapsed = time.perf_counter() - t0
    if unsupported:
        print("fattn answered UNSUPPORTED for %d row(s) (not compared, not failures):" % len(unsupported))
        for shape, why in unsupported:
            print("  %s: %s" % (shape, why))
    if no_ratio:
        print("%d row(s) without a fattn / cuDNN ratio (one of them did not run): %s" % (len(no_ratio),
              "; ".join(no_ratio)))
    print("%d failure(s), %.0f s" % (fails, elapsed))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"info": info, "rows": rows, "failures": fails, "elapsed_s": elapsed}, fh, indent=1)
        print("wrote %s" % a.json)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
