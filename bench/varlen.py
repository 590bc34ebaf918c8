"""varlen.py - variable-length prefill (issue 26): one fattn call on a ragged batch (cu_seqlens)
against the dense kernel on the same tokens and FlashAttention-3's varlen forward, one process.

    FATTN_LIBRARY=build/libfattn.so python3 bench/varlen.py [--json out.json] [--rounds 3]

The batch (--lens): 10 sequences of 100-8000 tokens, 16,384 in all, the issue's ragged causal
batch.  Rows: bf16, causal, head dims 64/128/256 at 2048/d query heads (16/16 at d128, as the
paper's tables), d128 with GQA 32/8, and d128 non-causal.  Backends, taking turns each round:
  fattn-varlen   one fattn_fwd call with cu_seqlens_q/k and total_q/k;
  dense-seq      the dense kernel on the same tokens: one fixed-length call per sequence, back to
                 back on one stream (batch 1, seqlen = that sequence's length);
  dense-uniform  the dense kernel on a batch of the same token count in equal sequences
                 (--uniform, default 4 x 4096): what the kernel does on this many tokens without
                 raggedness, counted on its own FLOPs;
  fa3-varlen     FA3's flash_attn_varlen_func on the same packed tensors (the fa3-fwd wheel).
TFLOPs/s with the paper's count (4 h s_q s_k d per sequence, halved when causal), CUDA events
around --calls back-to-back calls, the median of --iters samples, the best of --rounds rounds.
Correctness: fattn-varlen's O against dense-seq's and FA3's (max |diff|).
--bwd times the backward instead (fattn_bwd on the O and LSE of one forward; the FA3 wheel has no
backward): fattn-varlen, dense-seq and dense-uniform, 2.5x the forward's FLOPs (the paper's count),
and fattn-varlen's dQ, dK, dV against dense-seq's."""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import fattn  # noqa: E402
import compare  # noqa: E402
from decode import timed  # noqa: E402

LENS = "8000,3000,2000,1200,800,500,384,300,100,100"


def time_rounds(calls, res, a):
    """Each of calls [(name, fn, flops)] timed in turn for a.rounds rounds (decode.timed: the median of
    a.iters samples of a.calls back-to-back calls); the best round's ms and TFLOPs/s into res."""
    best = {}
    for _ in range(a.rounds):
        for name, fn, f in calls:
            ms = timed(fn, a.calls, a.iters)
            best[name] = min(best.get(name, ms), ms)
    for name, fn, f in calls:
        res[name + "_ms"] = best[name]
        res[name + "_tflops"] = f / best[name] / 1e9


def flops(h, lens_q, lens_k, d, causal):
    return sum(4.0 * h * a * b * d / (2 if causal and a == b else 1) for a, b in zip(lens_q, lens_k))


def as_varlen(a, lens, cu):
    """An args struct built for the packed [1, T, h, d] tensors (fattn_fwd_args or fattn_bwd_args), made a
    varlen call on cu_seqlens `cu` (int32 on the GPU, the sequences `lens` for q and k alike)."""
    a.p.batch, a.p.seqlen_q, a.p.seqlen_k = len(lens), max(lens), max(lens)
    a.p.cu_seqlens_q = a.p.cu_seqlens_k = cu.data_ptr()
    a.p.total_q = a.p.total_k = sum(lens)
    a._keep = a._keep + (cu,)
    return a


def varlen_args(ctx, q, k, v, o, lse, lens, cu, causal):
    """fattn_fwd_args for the packed [1, T, h, d] tensors with cu_seqlens `cu`."""
    return as_varlen(ctx.fwd_args(q, k, v, o, lse, causal), lens, cu)


def bwd_of(ctx, q, k, v, o, lse, causal, varlen=None):
    """fattn_bwd's args on the O and LSE of a forward (compare.bwd_args; varlen = (lens, cu) patches the
    problem as as_varlen does), with dO ~ N(0, 1) and dQ, dK, dV of its own: (args, (dq, dk, dv))."""
    dout = torch.randn_like(q)
    gs = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    b = compare.bwd_args(q, k, v, o, dout, *gs, lse, causal)
    if varlen is not None:
        as_varlen(b, *varlen)
    return b, gs


def row(ctx, fa3v, lens, hq, hk, d, causal, uniform, a):
    dt = torch.bfloat16
    T = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(1000 + d + hq)
    q = torch.randn(1, T, hq, d, device="cuda", dtype=dt, generator=g)
    k, v = (torch.randn(1, T, hk, d, device="cuda", dtype=dt, generator=g) for _ in range(2))
    o = torch.empty_like(q)
    lse = torch.empty(1, hq, T, device="cuda", dtype=torch.float32)
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)
    cu = torch.tensor(offs, dtype=torch.int32, device="cuda")
    av = varlen_args(ctx, q, k, v, o, lse, lens, cu, causal)
    # dense-seq: views of the same packed tensors, one call per sequence
    o_seq = torch.empty_like(q)
    lse_seq = [torch.empty(1, hq, n, device="cuda", dtype=torch.float32) for n in lens]
    seq_args = [ctx.fwd_args(q[:, s:e], k[:, s:e], v[:, s:e], o_seq[:, s:e], l, causal)
                for s, e, l in zip(offs[:-1], offs[1:], lse_seq)]
    ub, us = uniform
    qu = torch.randn(ub, us, hq, d, device="cuda", dtype=dt, generator=g)
    ku, vu = (torch.randn(ub, us, hk, d, device="cuda", dtype=dt, generator=g) for _ in range(2))
    ou, lu = torch.empty_like(qu), torch.empty(ub, hq, us, device="cuda", dtype=torch.float32)
    au = ctx.fwd_args(qu, ku, vu, ou, lu, causal)
    fl = flops(hq, lens, lens, d, causal)
    fl_u = flops(hq, [us] * ub, [us] * ub, d, causal)
    calls = [("fattn-varlen", lambda: ctx.fwd_raw(av), fl),
             ("dense-seq", lambda: [ctx.fwd_raw(x) for x in seq_args], fl),
             ("dense-uniform", lambda: ctx.fwd_raw(au), fl_u)]
    res = {"lens": lens, "heads_q": hq, "heads_kv": hk, "head_dim": d, "causal": bool(causal),
           "uniform": "%dx%d" % uniform, "pass": "bwd" if a.bwd else "fwd"}
    if a.bwd:
        ctx.fwd_raw(av), ctx.fwd_raw(au)
        for x in seq_args:
            ctx.fwd_raw(x)
        bv, gv = bwd_of(ctx, q, k, v, o, lse, causal, (lens, cu))
        bu, _ = bwd_of(ctx, qu, ku, vu, ou, lu, causal)
        dout_seq = bv._keep[4]  # dense-seq differentiates the same dO, per sequence
        gseq = tuple(torch.empty_like(x) for x in gv)
        bseq = [compare.bwd_args(q[:, s:e], k[:, s:e], v[:, s:e], o_seq[:, s:e], dout_seq[:, s:e],
                                 *(g[:, s:e] for g in gseq), l, causal)
                for s, e, l in zip(offs[:-1], offs[1:], lse_seq)]
        calls = [("fattn-varlen", lambda: ctx.bwd_raw(bv), 2.5 * fl),
                 ("dense-seq", lambda: [ctx.bwd_raw(x) for x in bseq], 2.5 * fl),
                 ("dense-uniform", lambda: ctx.bwd_raw(bu), 2.5 * fl_u)]
        time_rounds(calls, res, a)
        ctx.bwd_raw(bv)
        for x in bseq:
            ctx.bwd_raw(x)
        torch.cuda.synchronize()
        res["maxdiff_dense_seq"] = max((x.float() - y.float()).abs().max().item() for x, y in zip(gv, gseq))
        res["bits_equal_dense_seq"] = all(torch.equal(x, y) for x, y in zip(gv, gseq))
        res["lse_maxdiff_dense_seq"] = 0.0
        return res
    if fa3v is not None:
        q3, k3, v3 = q[0], k[0], v[0]
        calls.append(("fa3-varlen", lambda: fa3v(q3, k3, v3, cu, cu, max(lens), max(lens), softmax_scale=d ** -0.5,
                                                  causal=bool(causal)), fl))
    time_rounds(calls, res, a)
    ctx.fwd_raw(av)
    for x in seq_args:
        ctx.fwd_raw(x)
    torch.cuda.synchronize()
    res["maxdiff_dense_seq"] = (o.float() - o_seq.float()).abs().max().item()
    res["bits_equal_dense_seq"] = bool(torch.equal(o, o_seq))
    res["lse_maxdiff_dense_seq"] = max((lse[:, :, s:e] - l).abs().max().item()
                                       for s, e, l in zip(offs[:-1], offs[1:], lse_seq))
    if fa3v is not None:
        r = fa3v(q[0], k[0], v[0], cu, cu, max(lens), max(lens), softmax_scale=d ** -0.5, causal=bool(causal))
        r = r[0] if isinstance(r, (tuple, list)) else r
        res["maxdiff_fa3"] = (o[0].float() - r.float()).abs().max().item()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lens", default=LENS)
    ap.add_argument("--uniform", default="4x4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    lens = [int(x) for x in a.lens.split(",")]
    uniform = tuple(int(x) for x in a.uniform.split("x"))
    try:
        from fa3_fwd_interface import flash_attn_varlen_func as fa3v
    except Exception as e:  # not installed, or its extension does not load
        print("FA3: not available (%s)" % e)
        fa3v = None
    if a.bwd:
        fa3v = None  # the fa3-fwd wheel has no backward
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    ctx.set_stream(torch.cuda.current_stream().cuda_stream)
    print("device: %s, torch %s; %d sequences, %d tokens (%s)" % (torch.cuda.get_device_name(), torch.__version__,
                                                                len(lens), sum(lens), a.lens))
    rows = []
    hdr = "%-22s %9s %9s %9s %9s %7s %7s %7s  %s" % ("row", "varlen", "dense-seq", "uniform", "fa3-var",
                                                      "/seq", "/unif", "/fa3", "check")
    print(hdr)
    for hq, hk, d, causal in ((32, 32, 64, 1), (16, 16, 128, 1), (8, 8, 256, 1), (32, 8, 128, 1), (16, 16, 128, 0)):
        r = row(ctx, fa3v, lens, hq, hk, d, causal, uniform, a)
        rows.append(r)
        f3 = r.get("fa3-varlen_tflops")
        v = r["fattn-varlen_tflops"]
        print("%-22s %9.1f %9.1f %9.1f %9s %7.3f %7.3f %7s  dense-seq %s (%.2g, lse %.2g)%s" % (
            "%sh%d/%d d%d %s" % ("bwd " if a.bwd else "", hq, hk, d, "causal" if causal else "non-causal"), v,
            r["dense-seq_tflops"],
            r["dense-uniform_tflops"], "%.1f" % f3 if f3 else "n/a", v / r["dense-seq_tflops"],
            v / r["dense-uniform_tflops"], "%.3f" % (v / f3) if f3 else "n/a",
            "bits" if r["bits_equal_dense_seq"] else "differs", r["maxdiff_dense_seq"], r["lse_maxdiff_dense_seq"],
            ", fa3 %.2g" % r["maxdiff_fa3"] if "maxdiff_fa3" in r else ""))
        sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
