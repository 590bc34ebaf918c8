"""prefill.py - chunked prefill on a KV cache (issue 38): a chunk of new tokens attends, causal
and bottom-right aligned, to the keys already in the cache plus its own, as vLLM- and
SGLang-style engines call FlashAttention-3's flash_attn_with_kvcache on every prefill step.

    FATTN_LIBRARY=build/libfattn.so python3 bench/prefill.py [--json out.json]
    python3 bench/prefill.py --cpu-check      # small shapes on the CPU engine: the calls agree

The chunk's own keys are already in the cache (cache_seqlens = offset + chunk): the attention
step alone is timed, not the append.  Rows (bf16, GQA 32/8, head dim 128 by default): a chunk of
--chunk tokens (2048) at offset --offset (30720) of each of --batch sequences, with the cache
  - contiguous (fattn: flash_attn_with_kvcache, routed to the KV-cache varlen kernels),
  - paged, --pages sizes (16,64) with the pages in a shuffled order,
  - an FP8 cache (e4m3, per-token scales) on the first page size's pages: the paged prefill's KV8
    instances, its rate against the bf16 pages' and its max |diff| (quantisation included),
  - FA3 (the fa3-fwd wheel) on the contiguous shape: its flash_attn_with_kvcache where the wheel
    has it, else flash_attn_func on the same q and the cache's first offset + chunk keys (the
    same arithmetic: causal is bottom-right aligned in both),
  - fattn's flash_attn_func on those q, k, v (the same shape without a cache), for reference.
FLOPs: 4 x batch x heads_q x head_dim x the visible (query, key) pairs (chunk x offset + chunk
(chunk + 1) / 2).  Timing as decode.py: CUDA events around --calls back-to-back calls, the median
of --iters samples a round, the backends taking turns, the best of --rounds rounds.  Every
cache is larger than L2 at the default sizes.  Correctness: each backend's O against fattn's
contiguous O (max |diff|); paged against contiguous in bits.  Issue 38's targets: paged /
contiguous >= 0.95 for each page size; fattn contiguous / FA3 >= 1.0."""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import fattn  # noqa: E402
import decode  # noqa: E402  (bench/: its timing loop)


def timed(fn, calls, iters, cuda):
    """decode.py's CUDA-event median; on the CPU (--cpu-check) the wall clock's."""
    if cuda:
        return decode.timed(fn, calls, iters)
    out = []
    fn()
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(out)


def paged(cache, page, b, gen):
    """cache [b, n, h, d] as a shuffled page pool [b * npp, page, h, d] and its table [b, npp]."""
    n, h, d = cache.shape[1:]
    npp = (n + page - 1) // page
    perm = torch.randperm(b * npp, generator=gen).to(torch.int32)
    pad = torch.zeros(b, npp * page, h, d, device=cache.device, dtype=cache.dtype)
    pad[:, :n] = cache
    pool = torch.empty(b * npp, page, h, d, device=cache.device, dtype=cache.dtype)
    pool[perm.long().to(cache.device)] = pad.view(b * npp, page, h, d)
    return pool, perm.view(b, npp).to(cache.device)


def quantise_e4m3(pool):
    """A page pool [n, page, h, d] as e4m3 codes with float32 scales [n, h, page], amax / 448 per token
    and kv head (fattn.flash_attn_with_kvcache's per-token layout)."""
    x = pool.float()
    sc = (x.abs().amax(dim=3) / 448.0).clamp_min(2.0 ** -126)  # [n, page, h]
    codes = (x / sc[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes, sc.permute(0, 2, 1).contiguous()


def visible_pairs(chunk, offset):
    return chunk * offset + chunk * (chunk + 1) // 2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--offset", type=int, default=30720)
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--pages", default="16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--cpu-check", action="store_true",
                    help="small shapes (batch 2, chunk 40, offset 100, pages 16 and 4) on the CPU engine, "
                         "checking the calls agree; no timing worth reading")
    a = ap.parse_args()
    cuda = not a.cpu_check
    if a.cpu_check:
        a.batch, a.chunk, a.offset, a.pages, a.rounds, a.iters, a.calls = 2, 40, 100, "16,4", 1, 1, 1
    dev = "cuda" if cuda else "cpu"
    hq, hk = (int(x) for x in a.heads.split("/"))
    d, b, sq, off = a.head_dim, a.batch, a.chunk, a.offset
    sk = off + sq
    dt = torch.bfloat16
    fa3 = fa3_kv = None
    if cuda:
        try:
            import fa3_fwd_interface as fa3m
            fa3 = fa3m.flash_attn_func
            fa3_kv = getattr(fa3m, "flash_attn_with_kvcache", None)
        except Exception as e:  # not installed, or its extension does not load
            print("FA3: not available (%s)" % str(e).splitlines()[0][:160])
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(b, sq, hq, d, device=dev, dtype=dt, generator=g)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dt, generator=g)
    v = torch.randn(b, sk, hk, d, device=dev, dtype=dt, generator=g)
    seqlens = torch.full((b,), sk, dtype=torch.int32, device=dev)
    print("device: %s, torch %s, fattn %s" % (torch.cuda.get_device_name() if cuda else "CPU", torch.__version__,
                                              fattn.__version__))
    print("bf16, GQA %d/%d, d%d, batch %d: a chunk of %d queries at offset %d (cache %d keys per sequence, "
          "KV %.0f MB), causal bottom-right" % (hq, hk, d, b, sq, off, sk, 2.0 * b * sk * hk * d * 2 / 1e6))
    calls = [("fattn", lambda: fattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True))]
    keep = []
    for page in (int(x) for x in a.pages.split(",") if x):
        kp, table = paged(k, page, b, torch.Generator().manual_seed(2))
        vp, _ = paged(v, page, b, torch.Generator().manual_seed(2))
        keep += [kp, vp, table]
        calls.append(("fattn paged %d" % page, (lambda kp, vp, table: lambda: fattn.flash_attn_with_kvcache(
            q, kp, vp, cache_seqlens=seqlens, page_table=table, causal=True))(kp, vp, table)))
        if page == int(a.pages.split(",")[0]):  # an FP8 cache (e4m3, per-token scales) on the same pages
            (kp8, ks), (vp8, vs) = quantise_e4m3(kp), quantise_e4m3(vp)
            keep += [kp8, ks, vp8, vs]
            calls.append(("fattn fp8 paged %d" % page,
                          (lambda kp8, vp8, ks, vs, table: lambda: fattn.flash_attn_with_kvcache(
                              q, kp8, vp8, cache_seqlens=seqlens, page_table=table, causal=True, k_scale=ks,
                              v_scale=vs))(kp8, vp8, ks, vs, table)))
    calls.append(("fattn no cache", lambda: fattn.flash_attn_func(q, k, v, causal=True)))
    if fa3_kv is not None:
        calls.append(("fa3", lambda: fa3_kv(q, k, v, cache_seqlens=seqlens, causal=True)))
    elif fa3 is not None:
        calls.append(("fa3", lambda: fa3(q, k, v, causal=True)))
    outs, best = {}, {}
    for name, fn in list(calls):
        try:
            r = fn()
            if cuda:
                torch.cuda.synchronize()
            outs[name] = r[0] if isinstance(r, (tuple, list)) else r
        except Exception as e:  # a refusal or a peer's failure: the row reads n/a
            print("  %s: n/a (%s: %s)" % (name, type(e).__name__, str(e).splitlines()[0][:200]))
            calls.remove((name, fn))
    for rnd in range(a.rounds):
        order = calls[rnd % len(calls):] + calls[:rnd % len(calls)]
        for name, fn in order:
            ms = timed(fn, a.calls, a.iters, cuda)
            best[name] = min(best.get(name, ms), ms)
    fl = 4.0 * b * hq * d * visible_pairs(sq, off)
    ref = outs.get("fattn")
    row = {"batch": b, "chunk": sq, "offset": off, "heads_q": hq, "heads_kv": hk, "head_dim": d, "backends": {}}
    failed = False
    for name, _ in calls:
        ms = best[name]
        diff = same = None
        if ref is not None and name != "fattn" and outs.get(name) is not None:
            diff = (outs[name].float() - ref.float()).abs().max().item()
            if name.startswith("fattn paged"):
                same = bool(torch.equal(outs[name], ref))
                failed |= not same
        print("  %-18s %9.4f ms  %6.1f TFLOPs/s%s%s" % (
            name, ms, fl / ms / 1e9, "" if diff is None else "  max|O - fattn's| %.2e" % diff,
            "" if same is None else ("  bits = contiguous" if same else "  bits DIFFER from contiguous")))
        row["backends"][name] = {"ms": ms, "tflops": fl / ms / 1e9, "max_diff": diff, "same_bits": same}
    for name in best:
        if name.startswith("fattn fp8 paged"):
            bf = name.replace("fp8 ", "")
            if bf in best:
                print("  %s / %s: %.3f (the FP8 cache's rate against the bf16 cache's)" % (name, bf,
                                                                                          best[bf] / best[name]))
    if "fattn" in best:
        for name in best:
            if name.startswith("fattn paged"):
                r = best["fattn"] / best[name]
                print("  %s / contiguous: %.3f (target >= 0.95: %s)" % (name, r, "met" if r >= 0.95 else "NOT met"))
        if "fa3" in best:
            r = best["fa3"] / best["fattn"]
            print("  fattn contiguous / FA3: %.3f (target >= 1.0: %s)" % (r, "met" if r >= 1.0 else "NOT met"))
    if a.cpu_check:
        # against float64 on the CPU: the cache's first sk keys, bottom-right causal
        qf, kf, vf = (x.double() for x in (q, k, v))
        kf, vf = (x.repeat_interleave(hq // hk, dim=2) for x in (kf, vf))
        s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) / d ** 0.5
        mask = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + off
        o64 = torch.einsum("bhqk,bkhd->bqhd", s.masked_fill(mask, float("-inf")).softmax(-1), vf)
        err = (ref.double() - o64).abs().max().item()
        print("  fattn against float64: %.2e (bf16 output: tolerance 2e-2)" % err)
        failed |= not err < 2e-2
        print("cpu-check: %s" % ("FAILED" if failed else "passed"))
        sys.exit(1 if failed else 0)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
