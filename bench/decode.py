"""decode.py - decoding against a long KV cache (issue 26): fattn (contiguous and paged caches),
FlashAttention-3 (the fa3-fwd wheel) and cuDNN (torch SDPA with enable_gqa), one process, one run.

    FATTN_LIBRARY=build/libfattn.so python3 bench/decode.py [--json out.json] [--rounds 3]

Shapes (the issue's): bf16, GQA 32/8, head dim 128, seqlen_q 1, batch x seqlen_k 64 x 4096,
8 x 8192, 1 x 131072 (--shapes to change them), plus each shape with a paged cache (page 64,
pages in a shuffled order, --page).  Inputs N(0, 1) on the GPU; every cache is larger than L2.
Metrics: the K and V bytes a call must read (2 x batch x seqlen_k x heads_kv x d x 2 bytes) per
second, in TB/s, and TFLOPs/s (4 x batch x heads_q x seqlen_q x seqlen_k x d); the device's copy
bandwidth (a 4 GiB tensor copied, read + write bytes) measured in the same run.  Timing: CUDA
events around --calls back-to-back calls, the median of --iters samples per round, the backends
taking turns within each round (--rounds rounds, the best round's median reported, as compare.py).
Correctness: each backend's O against fattn's contiguous O (max |diff|), fattn's paged O
against its contiguous O (bits), and every backend's O of sequence 0 against float64 (max |O -
fp64|: the FP8 caches' error beside the bf16 cache's, issue 38).
An FP8 KV cache (fattn.h 0.5; --no-fp8 leaves it out): the paged cache quantised to e4m3 with
float32 scales per token ("fattn fp8 tok") and per page ("fattn fp8 page"), bf16 q; its TB/s
column counts the 16-bit cache's bytes (the "16-bit equivalent": the same keys over the FP8
call's time), the bytes it reads are printed beside it, and its max |diff| against fattn's O
includes e4m3's rounding of K and V."""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import fattn  # noqa: E402


def timed(fn, calls, iters):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    fn()
    for _ in range(iters):
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / calls)
    return statistics.median(out)


def copy_bandwidth(calls=5, iters=5):
    x = torch.empty(1 << 31, dtype=torch.int16, device="cuda")
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), calls, iters)
    del x, y
    return 2 * (1 << 32) / ms / 1e9  # TB/s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x4096,8x8192,1x131072")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen-q", type=int, default=1)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--no-fp8", action="store_true", help="without the FP8 KV cache rows")
    a = ap.parse_args()
    hq, hk = (int(x) for x in a.heads.split("/"))
    d, sq, page = a.head_dim, a.seqlen_q, a.page
    dt = torch.bfloat16
    try:
        import fa3_fwd_interface as fa3m
        fa3 = fa3m.flash_attn_func
        fa3_kv = getattr(fa3m, "flash_attn_with_kvcache", None)
    except Exception as e:  # not installed, or its extension does not load
        print("FA3: not available (%s)" % e)
        fa3 = fa3_kv = None
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    stream = torch.cuda.current_stream().cuda_stream
    ctx.set_stream(stream)
    copy_tbs = copy_bandwidth()
    print("device: %s, torch %s; copy bandwidth %.2f TB/s (4 GiB, read + write)" %
          (torch.cuda.get_device_name(), torch.__version__, copy_tbs))
    print("bf16, GQA %d/%d, d%d, seqlen_q %d, paged caches: page %d, pages shuffled" % (hq, hk, d, sq, page))
    rows = []
    for shp in a.shapes.split(","):
        b, sk = (int(x) for x in shp.split("x"))
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dt, generator=g)
        k = torch.randn(b, sk, hk, d, device="cuda", dtype=dt, generator=g)
        v = torch.randn(b, sk, hk, d, device="cuda", dtype=dt, generator=g)
        o = torch.empty_like(q)
        lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)
        args = ctx.fwd_args(q, k, v, o, lse, False)
        # the paged cache: the same keys in pages of `page`, in a shuffled order
        npp = (sk + page - 1) // page
        perm = torch.randperm(b * npp, generator=torch.Generator().manual_seed(2)).to(torch.int32)
        table = perm.view(b, npp).cuda()
        kp = torch.zeros(b * npp, page, hk, d, device="cuda", dtype=dt)
        vp = torch.zeros_like(kp)
        kpad = torch.zeros(b, npp * page, hk, d, device="cuda", dtype=dt)
        vpad = torch.zeros_like(kpad)
        kpad[:, :sk], vpad[:, :sk] = k, v
        kp[perm.long().cuda()] = kpad.view(b * npp, page, hk, d)
        vp[perm.long().cuda()] = vpad.view(b * npp, page, hk, d)
        del kpad, vpad
        op = torch.empty_like(q)
        lsep = torch.empty_like(lse)
        pargs = ctx.fwd_args(q, k, v, op, lsep, False)
        for name, pool in (("k", kp), ("v", vp)):
            t = getattr(pargs, name)
            t.data = pool.data_ptr()
            t.stride_batch, t.stride_seq, t.stride_head = page * hk * d, hk * d, d
        pargs.block_table = table.data_ptr()
        pargs.page_size, pargs.num_pages, pargs.max_pages_per_seq = page, b * npp, npp
        calls = [("fattn", lambda: ctx.fwd_raw(args)), ("fattn paged", lambda: ctx.fwd_raw(pargs))]
        fp8_bytes, fp8_out, keep = {}, {}, []
        if not a.no_fp8:
            for name, per_token in (("fattn fp8 tok", True), ("fattn fp8 page", False)):
                o8, lse8 = torch.empty_like(q), torch.empty_like(lse)
                a8 = ctx.fwd_args(q, k, v, o8, lse8, False)
                for tn, pool in (("k", kp), ("v", vp)):
                    x = pool.float()
                    amax = x.abs().amax(dim=3) if per_token else x.abs().amax(dim=(1, 3))  # [pages, page, hk] / [pages, hk]
                    sc = (amax / 448.0).clamp_min(2.0 ** -126)
                    codes = (x / (sc[..., None] if per_token else sc[:, None, :, None])).to(torch.float8_e4m3fn)
                    sc = (sc.permute(0, 2, 1) if per_token else sc).contiguous()  # [pages, hk, page] / [pages, hk]
                    keep += [codes, sc]
                    t = getattr(a8, tn)
                    t.data, t.dtype, t.scale, t.scale_block = codes.data_ptr(), fattn.E4M3, sc.data_ptr(), 1 if per_token else page
                    t.stride_batch, t.stride_seq, t.stride_head = page * hk * d, hk * d, d
                    del x
                a8.block_table = table.data_ptr()
                a8.page_size, a8.num_pages, a8.max_pages_per_seq = page, b * npp, npp
                fp8_bytes[name] = 2.0 * b * sk * hk * (d + (4 if per_token else 0))
                calls.append((name, (lambda z: lambda: ctx.fwd_raw(z))(a8)))
                fp8_out[name] = o8
                keep += [o8, lse8, a8]
        if fa3 is not None:
            calls.append(("fa3", lambda: fa3(q, k, v, causal=False)))
            if fa3_kv is not None:
                seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
                calls.append(("fa3 paged", lambda: fa3_kv(q, kp, vp, cache_seqlens=seqlens, page_table=table)))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True).transpose(1, 2)
        calls.append(("cudnn", cudnn))
        outs, best = {}, {}
        for name, fn in list(calls):
            try:
                r = fn()
                torch.cuda.synchronize()
                outs[name] = (r[0] if isinstance(r, (tuple, list)) else r) if r is not None else None
            except Exception as e:
                print("  %s: %s" % (name, str(e).splitlines()[0][:200]))
                calls.remove((name, fn))
        outs["fattn"], outs["fattn paged"] = o, op
        outs.update(fp8_out)
        for rnd in range(a.rounds):
            order = calls[rnd % len(calls):] + calls[:rnd % len(calls)]
            for name, fn in order:
                ms = timed(fn, a.calls, a.iters)
                best[name] = min(best.get(name, ms), ms)
        # every backend's error against float64 on sequence 0 (the FP8 caches' beside the bf16 one's)
        qf, kf, vf = (x[0].double() for x in (q, k, v))
        kf, vf = (x.repeat_interleave(hq // hk, dim=1) for x in (kf, vf))
        o64 = torch.einsum("hqk,khd->qhd", (torch.einsum("qhd,khd->hqk", qf, kf) / d ** 0.5).softmax(-1), vf)
        del qf, kf, vf
        kv_bytes = 2.0 * b * sk * hk * d * 2
        fl = 4.0 * b * hq * sq * sk * d
        print("\n%d x %d (KV %.0f MB)" % (b, sk, kv_bytes / 1e6))
        row = {"batch": b, "seqlen_k": sk, "heads_q": hq, "heads_kv": hk, "head_dim": d, "seqlen_q": sq,
               "page": page, "copy_tbs": copy_tbs, "backends": {}}
        for name, _ in calls:
            ms = best[name]
            diff = None
            if name != "fattn" and outs.get(name) is not None:
                diff = (outs[name].float() - o.float()).abs().max().item()
            same = None
            if name == "fattn paged":
                same = bool(torch.equal(op, o)) and bool(torch.equal(lsep, lse))
            err64 = None if outs.get(name) is None else (outs[name][0].double() - o64).abs().max().item()
            tbs = kv_bytes / ms / 1e9
            read = "" if name not in fp8_bytes else "  (reads %.2f TB/s)" % (fp8_bytes[name] / ms / 1e9)
            print("  %-14s %8.4f ms  %5.2f TB/s (%3.0f%% of copy)  %6.1f TFLOPs/s%s%s%s%s" %
                  (name, ms, tbs, 100 * tbs / copy_tbs, fl / ms / 1e9, read,
                   "" if err64 is None else "  max|O - fp64| %.2e" % err64,
                   "" if diff is None else "  max|O - fattn's| %.2e" % diff,
                   "" if same is None else ("  bits = contiguous" if same else "  bits differ from contiguous")))
            row["backends"][name] = {"ms": ms, "tbs": tbs, "tflops": fl / ms / 1e9, "max_diff": diff,
                                     "same_bits": same, "max_err_fp64_seq0": err64}
            if name in fp8_bytes:
                row["backends"][name]["read_tbs"] = fp8_bytes[name] / ms / 1e9
        for ref in ("fa3", "fa3 paged", "cudnn"):
            if ref in best:
                print("  fattn / %s: %.2fx%s" % (ref, best[ref] / best["fattn"],
                      "; fattn paged / %s: %.2fx" % (ref, best[ref] / best["fattn paged"]) if "paged" in ref else ""))
        print("  paged / contiguous (fattn): %.3f" % (best["fattn"] / best["fattn paged"]))
        for name in fp8_bytes:
            if name in best:
                print("  %s / fattn paged (speed-up of the FP8 cache): %.2fx" % (name, best["fattn paged"] / best[name]))
        rows.append(row)
        del q, k, v, kp, vp, o, op, keep, fp8_out, o64
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
