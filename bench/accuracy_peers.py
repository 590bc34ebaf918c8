#!/usr/bin/env python3
"""accuracy_peers.py - the FP8 accuracy protocol of `fattn accuracy` run by the peers, on the
same data: FlashAttention-3's FP8 forward (the fa3-fwd wheel), torch's SDPA and, when its Python
module is there, cuDNN's FP8 through cudnn-frontend; RMSE of each output against the FP64
reference that `fattn accuracy --dump DIR` wrote.

    fattn accuracy --engine cuda --dump DIR          # inputs, FP64 reference, fattn's rows
    python3 bench/accuracy_peers.py DIR [--peers LIST] [--seed N] [--json FILE]

Rows (--peers picks some; each one whose module is missing, or that raises, prints why and the
others run):
  fa3-bf16        FA3, bf16 inputs
  fa3-fp8-tensor  FA3 FP8, one scale per tensor (amax / 448): the paper's baseline
  fa3-fp8         FA3 FP8, one scale per (batch, kv head) (amax / 448): what FA3's code does
  fa3-fp8-had     the same after a random-sign Hadamard rotation of Q and K, applied here in
                  float64 outside the kernel (Q M (K M)^T = Q K^T; M = diag(signs) H / sqrt(d))
  cudnn-fp8       cuDNN's FP8 SDPA (cudnn-frontend's `cudnn` module), per-tensor scales, e4m3
                  output (its only FP8 output on Hopper) with the scale of the reference's amax
  sdpa-fp16       torch SDPA, fp16 inputs (its default backend)
  sdpa-bf16       torch SDPA, bf16 inputs
  torch-fp8       the fa3-fp8 quantisation dequantised, attention in float64 by torch: the
                  quantisation's share of FA3's error (off by default; --peers names it)
The FP8 rows quantise the dumped float32 inputs here with torch (x / scale, clamped to +-448,
then torch.float8_e4m3fn: round to nearest even); FA3 takes q/k/v_descale float32
[batch, heads_kv].  'vs tensor' divides by fa3-fp8-tensor; fattn's rows, read from the dump's
accuracy.json, keep their own ratio (to fattn's fp8-tensor).  FA3 is
`from fa3_fwd_interface import flash_attn_func` (the wheel on PYTHONPATH).  Without a GPU every
row but torch-fp8 and the SDPA rows skips (a test with a stand-in FA3 module can run here).
"""
import argparse
import json
import math
import os
import sys
import time

E4M3_MAX = 448.0
PEERS = ("fa3-bf16", "fa3-fp8-tensor", "fa3-fp8", "fa3-fp8-had", "cudnn-fp8", "sdpa-fp16", "sdpa-bf16",
         "torch-fp8")
DEFAULT_PEERS = PEERS[:-1]
WHAT = {
    "fa3-bf16": "FA3, bf16 in, bf16 out",
    "fa3-fp8-tensor": "FA3 FP8, one scale per tensor",
    "fa3-fp8": "FA3 FP8, one scale per (batch, kv head)",
    "fa3-fp8-had": "FA3 FP8, per (batch, kv head), Hadamard on Q,K",
    "cudnn-fp8": "cuDNN FP8, per tensor, e4m3 output",
    "sdpa-fp16": "torch SDPA, fp16 in, fp16 out",
    "sdpa-bf16": "torch SDPA, bf16 in, bf16 out",
    "torch-fp8": "per (batch, kv head) e4m3 inputs, float64 attention",
}


class Skip(Exception):
    """A peer that cannot run here (module missing, no GPU): its row says why."""


def load_dump(d, torch, device):
    """(meta, q, k, v float32 [b, s, h, d], ref float64) from a `fattn accuracy --dump` directory."""
    path = os.path.join(d, "accuracy.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("accuracy_peers: %s: %s (write it with `fattn accuracy --dump %s`)" % (path, e, d))
    if meta.get("layout") != "bshd" or meta.get("byteorder") != "little" or sys.byteorder != "little":
        sys.exit("accuracy_peers: %s: layout %s, byte order %s (this reader: bshd, little-endian on a %s-endian "
                 "host)" % (path, meta.get("layout"), meta.get("byteorder"), sys.byteorder))
    b, s, h, hd = meta["batch"], meta["seqlen"], meta["heads"], meta["head_dim"]
    n = b * s * h * hd
    out = []
    for name, dt, es in (("q", torch.float32, 4), ("k", torch.float32, 4), ("v", torch.float32, 4),
                         ("ref", torch.float64, 8)):
        f = os.path.join(d, meta["files"][name])
        size = os.path.getsize(f) if os.path.exists(f) else -1
        if size != n * es:
            sys.exit("accuracy_peers: %s has %d bytes; the shape %s needs %d" % (f, size, (b, s, h, hd), n * es))
        t = torch.from_file(f, shared=False, size=n, dtype=dt).view(b, s, h, hd)
        out.append(t.to(device))
    return meta, out[0], out[1], out[2], out[3]


def rmse(torch, o, ref):
    return float((o.to(torch.float64) - ref).pow(2).mean().sqrt().item())


def hadamard(torch, x, signs):
    """x [.., d] times M = diag(signs) H / sqrt(d), in float64 (H: Sylvester's Walsh-Hadamard matrix)."""
    d = x.shape[-1]
    hm = torch.ones(1, 1, dtype=torch.float64, device=x.device)
    while hm.shape[0] < d:
        hm = torch.cat([torch.cat([hm, hm], 1), torch.cat([hm, -hm], 1)], 0)
    m = signs.to(torch.float64)[:, None] * hm / math.sqrt(d)
    return (x.to(torch.float64).reshape(-1, d) @ m).reshape(x.shape)


def quantize(torch, x, per_head):
    """e4m3 codes of x [b, s, h, d] and the float32 descale: [b, h] per (batch, head) or every entry
    the tensor's amax / 448 (1 for an all-zero block)."""
    a = x.abs().to(torch.float32)
    amax = a.amax(dim=(1, 3)) if per_head else a.amax().expand(x.shape[0], x.shape[2])
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).contiguous()
    codes = (x.to(torch.float64) / scale[:, None, :, None].to(torch.float64)).clamp(-E4M3_MAX, E4M3_MAX)
    return codes.to(torch.float32).to(torch.float8_e4m3fn).contiguous(), scale


def load_fa3():
    try:
        from fa3_fwd_interface import flash_attn_func
    except Exception as e:  # ImportError, or its extension failing to load against this torch
        raise Skip("no FA3 (%s: %s; put the fa3-fwd wheel on PYTHONPATH)" % (
            type(e).__name__, (str(e).splitlines() or [""])[0][:120]))
    return flash_attn_func


def fa3_out(r):
    return r[0] if isinstance(r, (tuple, list)) else r


def need_cuda(torch):
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")


class Peers:
    """Each row's function returns (output [b, s, h, d], quantised-by) or raises Skip."""

    def __init__(self, torch, q, k, v, ref, scale, seed):
        self.torch, self.q, self.k, self.v, self.ref, self.scale, self.seed = torch, q, k, v, ref, scale, seed
        self._fa3 = None

    def fa3(self):
        if self._fa3 is None:
            self._fa3 = load_fa3()
        return self._fa3

    def signs(self):
        g = self.torch.Generator().manual_seed(self.seed)
        return (self.torch.randint(0, 2, (self.q.shape[-1],), generator=g) * 2 - 1).to(self.q.device)

    def fp8_inputs(self, per_head, rotate):
        q, k = self.q, self.k
        if rotate:
            sg = self.signs()
            q, k = hadamard(self.torch, q, sg), hadamard(self.torch, k, sg)
        return [quantize(self.torch, x, per_head) for x in (q, k, self.v)]

    def fa3_fp8(self, per_head, rotate):
        f = self.fa3()
        (q8, qs), (k8, ks), (v8, vs) = self.fp8_inputs(per_head, rotate)
        return fa3_out(f(q8, k8, v8, softmax_scale=self.scale, causal=False, q_descale=qs, k_descale=ks,
                         v_descale=vs)), "torch"

    def run(self, name):
        t = self.torch
        if name == "fa3-bf16":
            f = self.fa3()
            bf = [x.to(t.bfloat16) for x in (self.q, self.k, self.v)]
            return fa3_out(f(*bf, softmax_scale=self.scale, causal=False)), "-"
        if name == "fa3-fp8-tensor":
            return self.fa3_fp8(False, False)
        if name == "fa3-fp8":
            return self.fa3_fp8(True, False)
        if name == "fa3-fp8-had":
            return self.fa3_fp8(True, True)
        if name in ("sdpa-fp16", "sdpa-bf16"):
            dt = t.float16 if name == "sdpa-fp16" else t.bfloat16
            q, k, v = (x.to(dt).transpose(1, 2) for x in (self.q, self.k, self.v))  # [b, h, s, d]
            o = t.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
            return o.transpose(1, 2), "-"
        if name == "torch-fp8":
            return self.attend_fp64([c.to(t.float64) * s[:, None, :, None].to(t.float64)
                                     for c, s in self.fp8_inputs(True, False)]), "torch"
        if name == "cudnn-fp8":
            return self.cudnn_fp8(), "torch"
        raise ValueError(name)

    def attend_fp64(self, qkv, rows=1024):
        """softmax(q k^T * scale) v in float64, `rows` query rows at a time."""
        t = self.torch
        q, k, v = (x.transpose(1, 2) for x in qkv)  # [b, h, s, d]
        o = t.empty_like(q)
        for i in range(0, q.shape[2], rows):
            s = (q[:, :, i:i + rows] @ k.transpose(-1, -2)) * self.scale
            o[:, :, i:i + rows] = t.softmax(s, dim=-1) @ v
        return o.transpose(1, 2)

    def cudnn_fp8(self):
        """cuDNN's FP8 SDPA through cudnn-frontend: per-tensor descales, P scaled to [0, 448] before its
        e4m3 conversion, e4m3 output scaled by 448 / amax(reference)."""
        t = self.torch
        need_cuda(t)
        try:
            import cudnn
        except Exception as e:
            raise Skip("no cudnn-frontend module 'cudnn' (%s); torch's SDPA has no FP8 path" % type(e).__name__)
        (q8, qs), (k8, ks), (v8, vs) = self.fp8_inputs(False, False)
        b, s, h, d = q8.shape
        fp8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=t.cuda.current_stream().cuda_stream)
        g = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
        stride = (s * h * d, d, h * d, 1)  # [b, h, s, d] dims over BSHD memory
        tq, tk, tv = (g.tensor(name=n, dim=(b, h, s, d), stride=stride, data_type=fp8) for n in "qkv")
        one = {n: g.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)
               for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
        kw = dict(q=tq, k=tk, v=tv, attn_scale=self.scale, use_causal_mask=False, **one)
        try:
            o, _, amax_s, amax_o = g.sdpa_fp8(is_inference=True, **kw)
        except TypeError:  # newer cudnn-frontend: generate_stats instead of is_inference
            o, _, amax_s, amax_o = g.sdpa_fp8(generate_stats=False, **kw)
        o.set_output(True).set_dim((b, h, s, d)).set_stride(stride).set_data_type(fp8)
        for a in (amax_s, amax_o):
            if a is not None:
                a.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        o_scale = E4M3_MAX / float(self.ref.abs().max().item())
        val = {"descale_q": qs[0, 0], "descale_k": ks[0, 0], "descale_v": vs[0, 0], "descale_s": 1 / E4M3_MAX,
               "scale_s": E4M3_MAX, "scale_o": o_scale}
        o8 = t.empty_like(q8)
        pack = {tq: q8, tk: k8, tv: v8, o: o8}
        pack.update({one[n]: t.full((1, 1, 1, 1), float(x), device="cuda", dtype=t.float32) for n, x in val.items()})
        for a in (amax_s, amax_o):
            if a is not None:
                pack[a] = t.zeros(1, 1, 1, 1, device="cuda", dtype=t.float32)
        ws = t.empty(max(1, g.get_workspace_size()), device="cuda", dtype=t.uint8)
        g.execute(pack, ws, handle=handle)
        t.cuda.synchronize()
        return o8.to(t.float32) / o_scale


def fmt_row(name, engine, quant, rm, ra, what):
    return "%-20s %-6s %-6s %-11s %-9s %s" % (name, engine, quant, rm, ra, what)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="the directory `fattn accuracy --dump DIR` wrote")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                    help="comma-separated, from %s (default: all but torch-fp8)" % ",".join(PEERS))
    ap.add_argument("--seed", type=int, default=1, help="seed of the Hadamard rotation's signs (default 1)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    a = ap.parse_args()
    names = [n for n in a.peers.split(",") if n]
    bad = [n for n in names if n not in PEERS]
    if bad:
        ap.error("--peers: %s (from %s)" % (",".join(bad), ",".join(PEERS)))
    try:
        import torch
    except ImportError as e:
        sys.exit("accuracy_peers: torch is needed (%s)" % e)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    meta, q, k, v, ref = load_dump(a.dump, torch, device)
    b, s, h, hd = meta["batch"], meta["seqlen"], meta["heads"], meta["head_dim"]
    scale = float(meta.get("softmax_scale") or 1 / math.sqrt(hd))
    engine = "cuda" if str(device).startswith("cuda") else "cpu"
    dev_name = torch.cuda.get_device_name() if engine == "cuda" else "cpu"
    print("accuracy_peers: %s: batch %d, seqlen %d, heads %d, head dim %d, inputs %s, seed %s; on %s, torch %s"
          % (a.dump, b, s, h, hd, meta.get("inputs"), meta.get("seed"), dev_name, torch.__version__))
    print("RMSE of O against the dumped FP64 reference; 'vs tensor': peers / fa3-fp8-tensor, fattn's rows / "
          "fattn's fp8-tensor\n")
    peers = Peers(torch, q, k, v, ref, scale, a.seed)
    results = []
    for n in names:
        r = {"method": n, "engine": engine, "what": WHAT[n], "rmse": None, "quantized_on": "-"}
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                o, r["quantized_on"] = peers.run(n)
                if engine == "cuda":
                    torch.cuda.synchronize()
                r["rmse"] = rmse(torch, o, ref)
                del o
        except Skip as e:
            r["skipped"] = str(e)
        except Exception as e:  # a peer that raises: its row says so, the others run
            r["error"] = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:200])
        r["seconds"] = round(time.perf_counter() - t0, 2)
        results.append(r)
        print("  %s: %s" % (n, "RMSE %.3e" % r["rmse"] if r["rmse"] is not None else r.get("skipped") or r.get("error")),
              file=sys.stderr, flush=True)
    base = next((r["rmse"] for r in results if r["method"] == "fa3-fp8-tensor" and r["rmse"]), None)
    for r in results:
        r["ratio_to_fp8_tensor"] = r["rmse"] / base if base and r["rmse"] is not None else None

    print(fmt_row("method", "engine", "quant", "RMSE", "vs tensor", "what"))
    fat = meta.get("fattn") or {}
    for r in fat.get("results") or []:
        rm = "%.3e" % r["rmse"] if r.get("rmse") is not None else "n/a"
        ra = "%.3f" % r["ratio_to_fp8_tensor"] if r.get("ratio_to_fp8_tensor") is not None else "-"
        print(fmt_row("fattn " + r["method"], r.get("engine", "?"), r.get("quantized_on", "-"), rm, ra,
                      "from the dump" + ("; FAILED: " + r["error"][:80] if r.get("error") else "")))
    for r in results:
        rm = "%.3e" % r["rmse"] if r["rmse"] is not None else "n/a"
        ra = "%.3f" % r["ratio_to_fp8_tensor"] if r["ratio_to_fp8_tensor"] is not None else "-"
        what = r["what"] if r["rmse"] is not None else (
            "skipped: " + r["skipped"] if "skipped" in r else "FAILED: " + r["error"])
        print(fmt_row(r["method"], r["engine"], r["quantized_on"], rm, ra, what))
    got = {r["method"]: r["rmse"] for r in results if r["rmse"]}
    if got.get("fa3-fp8") and got.get("fa3-fp8-had"):
        print("\nFA3 per-head / per-head+Hadamard RMSE: %.2f (paper: 2.4e-2 / 9.1e-3 = 2.6)"
              % (got["fa3-fp8"] / got["fa3-fp8-had"]))
    if a.json:
        out = {"dump": os.path.abspath(a.dump), "shape": [b, s, h, hd], "inputs": meta.get("inputs"),
               "seed": meta.get("seed"), "hadamard_seed": a.seed, "device": dev_name, "torch": torch.__version__,
               "results": results, "fattn": meta.get("fattn")}
        try:
            from importlib.metadata import version
            out["fa3_version"] = version("fa3_fwd")
        except Exception:
            out["fa3_version"] = None
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
