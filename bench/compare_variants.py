"""bench/compare.py --variants: fattn's attention variants (issue 37) beside the peers that have them,
forward (--variants) or backward (--variants --bwd), all calls of a row taking turns in one process
as in compare.py's other modes (its take_turns, time_fn, JSON after every row).  Run it through
compare.py; this file holds only what the variants add.

Rows (bf16, hidden 2048: heads = 2048 / head_dim; batch = --tokens (16384) / seqlen, at least 1):
  window   d128 causal, window_size (4096, 0), seqlen 32768 and 8192
  softcap  d128 softcap 30, causal and not, seqlen 4096 and 16384
  sinks    d128 and d64 causal, one float32 learnable sink logit per head, seqlen 16384
  hd192    head_dim 192, head_dim_v 128 (16 heads), causal and not, seqlen 16384
Columns: fattn (the variant), fattn-plain (the same call without it: no window, softcap or sink; for
hd192 head_dim_v 192), and the peers that can express the variant: FA3 (fa3-fwd wheel, forward only:
softcap, hd192), FA4 (flash_attn.cute, forward and backward: all four), cuDNN (torch SDPA: hd192 only).
FLOPs: 2 * b * h * (d + dv) * (score entries computed); entries = sq * sk, halved when causal (the
paper's count, = compare.py's flops at d == dv), with a window the exact number of unmasked (query,
key) pairs; the backward 2.5 x the forward's (compare.BWD_FLOPS).
"""
import collections
import json
import sys
import time

import compare as C  # compare.py registers itself under this name when it runs as the script

torch, fattn = C.torch, C.fattn
F, SDPBackend = getattr(C, "F", None), getattr(C, "SDPBackend", None)

KINDS = ("window", "softcap", "sinks", "hd192")
KIND_LABEL = {"window": "window", "softcap": "softcap", "sinks": "sinks", "hd192": "192/128"}
WINDOW = (4096, 0)  # (left, right) keys: issue 37's target shape
SOFTCAP = 30.0      # Gemma 2's attention softcap
VAR_BACKENDS = ("fattn", "fattn-plain", "cudnn", "fa3", "fa4")
VAR_LABEL = {"fattn": "fattn", "fattn-plain": "plain", "cudnn": "cuDNN", "fa3": "FA3", "fa4": "FA4"}
# the variants each peer can express, per direction: the fa3-fwd wheel has no local (window) kernels,
# no sink argument and no backward; torch SDPA has no window (only a dense mask, not its fast path),
# no softcap and no sinks
PEER_KINDS = {"fwd": {"fa3": {"softcap", "hd192"}, "fa4": set(KINDS), "cudnn": {"hd192"}},
              "bwd": {"fa3": set(), "fa4": set(KINDS), "cudnn": {"hd192"}}}
# fattn's tiles on the windowed rows (queries x keys): the forward's d128 local kernel is 128 x 128
# (fwd_kernels.def FWD_D128_LOCAL), the backward's d128 kernel 64 queries x 128 keys (bwd_traits.cuh)
TILE = {"fwd": (128, 128), "bwd": (64, 128)}
# issue 37's targets, checked per row: (what, "<=" or ">=", bound); "bound" is fattn's time over
# (fattn-plain's time x the fraction of tiles the window visits), "t/plain" fattn's time over fattn-plain's,
# a backend name fattn's TFLOPs/s over that backend's
TARGETS = {("window", "fwd"): (("bound", "<=", 1.10), ("fa4", ">=", 1.0)),
           ("window", "bwd"): (("bound", "<=", 1.10), ("fa4", ">=", 1.0)),
           ("softcap", "fwd"): (("fa3", ">=", 1.1),), ("softcap", "bwd"): (("fa4", ">=", 1.1),),
           ("sinks", "fwd"): (("t/plain", "<=", 1.03),), ("sinks", "bwd"): (("t/plain", "<=", 1.03),),
           ("hd192", "fwd"): (("fa3", ">=", 1.0),), ("hd192", "bwd"): (("fa4", ">=", 1.0),)}

VRow = collections.namedtuple("VRow", "kind d dv causal s b h window softcap sink")


def variant_rows(kinds, causal, tokens=16384, hidden=2048):
    """The rows of `kinds` (a subset of KINDS), masks by `causal` ("both", "0", "1")."""
    def row(kind, d, dv, c, s, heads, window=None, softcap=0.0, sink=False):
        return VRow(kind, d, dv, c, s, max(1, tokens // s), heads, window, softcap, sink)
    rows = [row("window", 128, 128, True, s, hidden // 128, window=WINDOW) for s in (32768, 8192)]
    rows += [row("softcap", 128, 128, c, s, hidden // 128, softcap=SOFTCAP) for c in (True, False)
             for s in (4096, 16384)]
    rows += [row("sinks", d, d, True, 16384, hidden // d, sink=True) for d in (128, 64)]
    rows += [row("hd192", 192, 128, c, 16384, hidden // 128) for c in (True, False)]
    masks = {"both": (False, True), "0": (False,), "1": (True,)}[causal]
    return [r for r in rows if r.kind in kinds and r.causal in masks]


def plain(r):
    """The same call without the variant (hd192: head_dim_v = head_dim)."""
    return r._replace(dv=r.d, window=None, softcap=0.0, sink=False)


def key_range(i, sq, sk, causal, window):
    """Keys [lo, hi] query i sees (fattn.h's window rule; causal cuts the right side at the diagonal)."""
    off = sk - sq
    lo, hi = 0, sk - 1
    if window is not None:
        if window[0] >= 0:
            lo = max(lo, i + off - window[0])
        if window[1] >= 0:
            hi = min(hi, i + off + window[1])
    if causal:
        hi = min(hi, i + off)
    return lo, hi


def score_entries(r):
    """Score entries the FLOP count charges: sq * sk, halved when causal (as compare.flops), or with a
    window the exact number of unmasked (query, key) pairs."""
    if r.window is None:
        return r.s * r.s / (2 if r.causal else 1)
    return sum(max(0, hi - lo + 1) for lo, hi in (key_range(i, r.s, r.s, r.causal, r.window) for i in range(r.s)))


def variant_flops(r, mode="fwd"):
    """2 * b * h * (d + dv) * entries; x compare.BWD_FLOPS for the backward."""
    f = 2.0 * r.b * r.h * (r.d + r.dv) * score_entries(r)
    return f * (C.BWD_FLOPS if mode == "bwd" else 1.0)


def tiles_visited(r, bm, bn):
    """(query tile of bm rows, key tile of bn keys) pairs holding at least one unmasked entry: the tiles a
    kernel that skips fully masked tiles computes (the same count whichever side it loops over)."""
    n = 0
    for q0 in range(0, r.s, bm):
        lo, _ = key_range(q0, r.s, r.s, r.causal, r.window)
        _, hi = key_range(min(q0 + bm, r.s) - 1, r.s, r.s, r.causal, r.window)
        if hi >= lo:  # the rows' ranges move right with the row, so the tile's union is [lo(first), hi(last)]
            n += hi // bn - lo // bn + 1
    return n


def tile_fraction(r, mode):
    """Tiles the window visits over those the plain causal call visits, at fattn's tile (TILE)."""
    bm, bn = TILE[mode]
    return tiles_visited(r, bm, bn) / tiles_visited(plain(r), bm, bn)


def fattn_variants(r, sink):
    """The variant's fields as python/fattn's _core.Variants (sink: the float32 [h] tensor or None)."""
    from fattn import _core
    return _core.Variants(r.window, r.softcap, sink.data_ptr() if sink is not None else None)


class VariantCase:
    """One row's inputs (Q, K ~ N(0, 1) [b, s, h, d], V and dO [b, s, h, dv]; for hd192 also V [b, s, h, d]
    for fattn-plain; sinks float32 [h] ~ N(0, 1); the seed's generator on `device`) and, per backend, one
    call: calls[name] = (fn, what fn runs under: None or the SDPA backend); a backend whose set-up fails
    is in errors[name] instead.
    fwd: fattn and fattn-plain fattn_fwd (ctx.fwd_raw) on fwd_args whose problem carries the variant
      (_core.set_variants: window, window_left/right, softcap; fattn_fwd_args.learnable_sink); fa3, fa4
      and cudnn their forward with the variant's arguments (fa3_kwargs, fa4_kwargs).
    bwd: fattn and fattn-plain fattn_bwd alone on the O and LSE of one forward run here (with the sink:
      learnable_sink and dsink set, as a training step needs dsink); the peers
      torch.autograd.grad(O, (q, k, v[, sink]), dO, retain_graph=True) on one forward's graph, as
      compare.py --bwd.
    out(name, r): O (fwd) or the gradients (bwd) of calls[name]'s call that returned r.  Keep the object
    alive while calling.  device "cpu" (with a CPU context) builds the same calls on the CPU engine."""

    def __init__(self, ctx, r, mode, backends, seed, dtype=None, fa3=None, fa4=None, device="cuda"):
        dtype = dtype or torch.bfloat16
        g = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape, dt=dtype):
            return torch.randn(*shape, device=device, dtype=dt, generator=g)
        self.r, self.mode, self.scale = r, mode, r.d ** -0.5
        self.q, self.k = randn(r.b, r.s, r.h, r.d), randn(r.b, r.s, r.h, r.d)
        self.v, self.dout = randn(r.b, r.s, r.h, r.dv), randn(r.b, r.s, r.h, r.dv)
        self.v_plain = self.v if r.dv == r.d else randn(r.b, r.s, r.h, r.d)
        self.dout_plain = self.dout if r.dv == r.d else randn(r.b, r.s, r.h, r.d)
        self.sink = randn(r.h, dt=torch.float32) if r.sink else None
        if device == "cuda":
            ctx.set_stream(torch.cuda.current_stream().cuda_stream)
        self.calls, self.errors, self.outs = {}, {}, {}
        for name in backends:
            try:
                if name in ("fattn", "fattn-plain"):
                    self.make_fattn(ctx, name)
                else:
                    self.make_peer(name, fa3, fa4)
            except Exception as e:  # noqa: BLE001 - the row records it
                self.errors[name] = e

    def make_fattn(self, ctx, name):
        from fattn import _core
        r = self.r if name == "fattn" else plain(self.r)
        q, k = self.q, self.k
        v, dout = (self.v, self.dout) if name == "fattn" else (self.v_plain, self.dout_plain)
        sink = self.sink if r.sink else None
        o = torch.empty(r.b, r.s, r.h, r.dv, device=q.device, dtype=q.dtype)
        lse = torch.empty(r.b, r.h, r.s, device=q.device, dtype=torch.float32)
        fargs = ctx.fwd_args(q, k, v, o, lse, r.causal, self.scale)
        var = fattn_variants(r, sink)
        _core.set_variants(fargs.p, var)
        fargs.learnable_sink = var.learnable_sink
        fargs._keep += (sink,)
        if self.mode == "fwd":
            self.outs[name] = o
            self.calls[name] = (lambda: ctx.fwd_raw(fargs), None)
            return
        ctx.fwd_raw(fargs)  # the O and LSE the backward reads
        grads = tuple(torch.empty_like(x) for x in (q, k, v)) + ((torch.zeros_like(sink),) if sink is not None
                                                                 else ())
        bargs = C.bwd_args(q, k, v, o, dout, *grads[:3], lse, r.causal)
        bargs.p.softmax_scale = self.scale
        _core.set_variants(bargs.p, var)
        if sink is not None:  # dsink: what a training step with learnable sinks asks for (FA4 computes it too)
            bargs.learnable_sink, bargs.dsink = var.learnable_sink, grads[3].data_ptr()
        bargs._keep += (sink, grads)
        self.outs[name] = grads
        self.calls[name] = (lambda: ctx.bwd_raw(bargs), None)  # dsink is written, not accumulated (fattn.h)

    def make_peer(self, name, fa3, fa4):
        r = self.r
        if r.kind not in PEER_KINDS[self.mode][name]:
            raise NotApplicable("%s cannot express %s (%s)" % (VAR_LABEL[name], KIND_LABEL[r.kind], self.mode))
        grad = self.mode == "bwd"
        q, k, v = (x.detach().requires_grad_(grad) for x in (self.q, self.k, self.v))  # the same storage
        sink = self.sink.detach().requires_grad_(grad) if self.sink is not None else None
        be = None
        if name == "cudnn":
            be = SDPBackend.CUDNN_ATTENTION
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views, as SDPA takes them

            def fwd():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=r.causal, scale=self.scale).transpose(1, 2)
        elif name == "fa3":
            if fa3 is None:
                raise RuntimeError("FA3 not loaded")
            kw = fa3_kwargs(r, self.scale)

            def fwd():
                return C.first(fa3(q, k, v, **kw))
        elif name == "fa4":
            if fa4 is None:
                raise RuntimeError("FA4 not loaded")
            kw = fa4_kwargs(r, self.scale, sink)

            def fwd():  # keywords only: the interface has positional parameters (qv, ...) before them
                return C.first(fa4(q, k, v, **kw))
        else:
            raise ValueError(name)
        if not grad:
            self.calls[name] = (fwd, be)
            return
        with C.turn_context(be):
            o = fwd()  # the graph the timed backward calls run on (FA4 compiles its kernels here)
        inputs = (q, k, v) + ((sink,) if sink is not None else ())
        # allow_unused: a peer whose backward returns no dsink still times; its dsink is then not compared
        self.calls[name] = ((lambda: torch.autograd.grad(o, inputs, self.dout, retain_graph=True, allow_unused=True)),
                            None)

    def out(self, name, ret):
        if name in ("fattn", "fattn-plain"):
            return self.outs[name]
        return ret


class NotApplicable(Exception):
    """A peer that cannot express the row's variant: its cell reads '-', not n/a."""


def fa3_kwargs(r, scale):
    """fa3_fwd_interface.flash_attn_func's keywords for row r (the wheel: softcap, 192/128; no window)."""
    kw = {"softmax_scale": scale, "causal": r.causal}
    if r.softcap:
        kw["softcap"] = r.softcap
    if r.window is not None:
        kw["window_size"] = r.window  # not reached: PEER_KINDS keeps the wheel off the windowed rows
    return kw


def fa4_kwargs(r, scale, sink):
    """flash_attn.cute.flash_attn_func's keywords for row r: window_size (left, right) with causal (FA4 then
    runs its local kernels with the right side 0), softcap, learnable_sink (float32 [h])."""
    kw = {"softmax_scale": scale, "causal": r.causal}
    if r.window is not None:
        kw["window_size"] = tuple(r.window)
    if r.softcap:
        kw["softcap"] = r.softcap
    if sink is not None:
        kw["learnable_sink"] = sink
    return kw


def bench_variant_case(ctx, r, mode, a, backends, fa3=None, fa4=None, device="cuda", dtype=None, timed=True):
    """One row: each backend's call once (fattn's first: the reference; failures recorded as <name>_error,
    '-' cells as <name>_na; neither is timed), O (fwd, absolute) or dQ, dK, dV[, dsink] (bwd, relative to
    the largest) against fattn's, then the calls take turns (compare.take_turns) with FLOPs by
    variant_flops (fattn-plain: its own row's count)."""
    t_row = time.perf_counter()
    case = VariantCase(ctx, r, mode, backends, 4321 + r.s + r.d + KINDS.index(r.kind), dtype, fa3, fa4, device)
    fl = {n: variant_flops(plain(r) if n == "fattn-plain" else r, mode) for n in backends}
    res = {"kind": r.kind, "mode": mode, "dtype": str(case.q.dtype).split(".")[-1], "batch": r.b, "seqlen": r.s,
           "heads": r.h, "head_dim": r.d, "head_dim_v": r.dv, "causal": r.causal, "window": r.window,
           "softcap": r.softcap, "sink": r.sink, "flops": fl.get("fattn"), "flops_plain": fl.get("fattn-plain")}
    if r.window is not None:
        res["tile_fraction"] = tile_fraction(r, mode)
        res["entry_fraction"] = score_entries(r) / score_entries(plain(r))
    for name, e in case.errors.items():
        if isinstance(e, NotApplicable):
            res[C.key(name) + "_na"] = str(e)
        else:
            res[C.key(name)], res[C.key(name) + "_error"] = None, C.short_error(e)
    fns, ref = [], None
    for name in sorted(case.calls, key=lambda n: n != "fattn"):  # fattn's output first: the reference
        fn, be = case.calls[name]
        try:
            with C.turn_context(be):
                ret = fn()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - say, fattn_bwd UNSUPPORTED or a peer refusing the shape
            res[C.key(name)], res[C.key(name) + "_error"] = None, C.short_error(e, 200)
            continue
        out = case.out(name, ret)
        if name == "fattn":
            ref = [x.detach().clone() for x in (out if mode == "bwd" else (out,))]
        elif ref is not None and name != "fattn-plain":
            try:
                xs = [x.detach() for x in (out if mode == "bwd" else (out,)) if x is not None]
                res[C.key(name) + "_maxdiff"] = (C.grad_maxdiff(xs, ref) if mode == "bwd" else
                                                 float((xs[0].float() - ref[0].float()).abs().max().item()))
                if mode == "bwd" and len(xs) == 4 and len(ref) == 4:
                    res[C.key(name) + "_dsink_maxdiff"] = C.grad_maxdiff(xs[3:], ref[3:])
            except Exception:  # noqa: BLE001 - an output this script cannot read: timed all the same
                res[C.key(name) + "_maxdiff"] = None
        fns.append((name, fn, be))
    fns.sort(key=lambda f: backends.index(f[0]))
    ref = ret = out = None  # not held while timing
    if fns and timed:
        C.take_turns(res, fns, fl, a.iters, a.rounds, a.order == "rotate", a.settle_ms, a.cooldown_ms)
        derive(res)
    del case
    res["row_s"] = round(time.perf_counter() - t_row, 2)
    return res


def derive(res):
    """Times (ms) from TFLOPs/s, fattn's time over fattn-plain's, the window bound, fattn over each peer."""
    for n in VAR_BACKENDS:
        if res.get(C.key(n)):
            fl = res["flops_plain"] if n == "fattn-plain" else res["flops"]
            res[C.key(n) + "_ms"] = fl / (res[C.key(n)] * 1e12) * 1e3
    if res.get("fattn_ms") and res.get("fattn_plain_ms"):
        res["t_over_plain"] = res["fattn_ms"] / res["fattn_plain_ms"]
        if "tile_fraction" in res:
            res["bound"] = res["t_over_plain"] / res["tile_fraction"]
    for n in ("cudnn", "fa3", "fa4"):
        if res.get("fattn") and res.get(n):
            res["fattn_over_" + n] = res["fattn"] / res[n]


def metric(res, what):
    return {"bound": res.get("bound"), "t/plain": res.get("t_over_plain")}.get(what, res.get("fattn_over_" + what))


def cell(res, n, width=7):
    v = res.get(C.key(n))
    if v:
        return "%*.1f" % (width, v)
    return ("-" if C.key(n) + "_na" in res else "n/a").rjust(width)


def row_label(r):
    return "%-7s %7s %-6s %6d %2d %3d" % (KIND_LABEL[r.kind], "%d/%d" % (r.d, r.dv), "causal" if r.causal else "none",
                                         r.s, r.b, r.h)


def estimate_variants_s(rows, mode, backends, a, fa4_ok=True):
    """Expected seconds: start-up, per row its set-up and every entry's turns (compare.turn_s at the estimate's
    rates), FA4's compilation per distinct (kind, head dims, mask)."""
    tot = C.EST_START_S
    suffix = "-bwd" if mode == "bwd" else ""
    for r in rows:
        names = [n for n in backends if n in ("fattn", "fattn-plain") or r.kind in PEER_KINDS[mode][n]]
        tot += (C.EST_ROW_S_BWD if mode == "bwd" else C.EST_ROW_S) + sum(
            a.rounds * C.turn_s(("fattn" if n == "fattn-plain" else n) + suffix,
                                variant_flops(plain(r) if n == "fattn-plain" else r, mode), r.causal, a.iters,
                                a.settle_ms, a.cooldown_ms)
            for n in names if n != "fa4" or fa4_ok)
    if "fa4" in backends and fa4_ok:
        tot += C.EST_FA4_COMPILE_S * len({(r.kind, r.d, r.dv, r.causal) for r in rows})
    return tot


def main_variants(a, ap):
    """--variants [--bwd]: the rows of --kinds, each backend's forward (or backward) alone, taking turns."""
    for opt, given in (("--fp8", a.fp8), ("--ablation", a.ablation), ("--fattn-lib-b", a.fattn_lib_b),
                       ("--ab-option", a.ab_option), ("--png", a.png), ("--bwd-deterministic", a.bwd_deterministic),
                       ("--bwd-no-fwd", a.bwd_no_fwd), ("--rows", a.rows), ("--dtypes", a.dtypes),
                       ("--head-dims", a.head_dims), ("--seqlens", a.seqlens)):
        if given:
            ap.error("%s is not available with --variants (its rows are fixed: pick them with --kinds and "
                     "--causal)" % opt)
    mode = "bwd" if a.bwd else "fwd"
    kinds = a.kinds.split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error("--kinds: %s (from %s)" % (",".join(bad), ",".join(KINDS)))
    backends = a.backends.split(",") if a.backends else [n for n in VAR_BACKENDS if n != "fa3" or mode == "fwd"]
    bad = [n for n in backends if n not in VAR_BACKENDS]
    if bad or "fattn" not in backends or len(set(backends)) != len(backends):
        ap.error("--backends with --variants: %s (from %s, once each, fattn among them)" % (
            ",".join(bad) or "fattn missing or a name twice", ",".join(VAR_BACKENDS)))
    rows = variant_rows(kinds, a.causal or "both", a.tokens, a.hidden)
    if not rows:
        ap.error("--kinds %s with --causal %s: no rows" % (a.kinds, a.causal))
    want = {n for r in rows for n in backends if n in PEER_KINDS[mode] and r.kind in PEER_KINDS[mode][n]}
    if a.dry_run or C.IMPORT_ERROR is not None:
        fa3, fa3_info = None, "not loaded"
        fa4, fa4_info = None, "not loaded"
    else:
        fa3, fa3_info = C.load_fa3() if "fa3" in want else (None, "not used by these rows")
        fa4, fa4_info = C.load_fa4() if "fa4" in want else (None, "not used by these rows")
    est = estimate_variants_s(rows, mode, backends, a, fa4_ok=fa4 is not None or a.dry_run)
    print("%d variant rows (%s; %s) x backends %s, %s alone, x %d rounds x (settle %.0f ms + %d x 10 calls): "
          "expected ~%.0f s (%.1f min)" % (len(rows), ",".join(kinds), "masks " + (a.causal or "both"),
                                          ",".join(backends), "backward" if mode == "bwd" else "forward",
                                          a.rounds, a.settle_ms, a.iters, est, est / 60))
    print("  FLOPs = 2 b h (d + dv) x entries, entries = sq sk (halved causal) or, with a window, the unmasked "
          "(query, key) pairs%s" % ("; backward %.1f x the forward's" % C.BWD_FLOPS if mode == "bwd" else ""))
    for r in rows:
        extra = ""
        if r.window is not None:
            extra = ", window (%d, %d): %.4f of the causal entries, %.4f of the causal %dx%d tiles" % (
                r.window[0], r.window[1], score_entries(r) / score_entries(plain(r)), tile_fraction(r, mode),
                TILE[mode][0], TILE[mode][1])
        peers = [VAR_LABEL[n] for n in backends if n in PEER_KINDS[mode] and r.kind in PEER_KINDS[mode][n]]
        print("  %s: %.3f TFLOP per call (plain %.3f)%s%s; peers: %s" % (
            row_label(r), variant_flops(r, mode) / 1e12, variant_flops(plain(r), mode) / 1e12,
            ", softcap %g" % r.softcap if r.softcap else "", extra + (", float32 sink per head" if r.sink else ""),
            ", ".join(peers) or "none"))
    if "fa4" in want:
        print("  FA4 compiles its kernels on first use: counted as %.0f s per kind, head dims and mask, a guess"
              % C.EST_FA4_COMPILE_S)
    if est > 540:
        print("  over 9 minutes: one device command may run 10; split it with --kinds or --causal")
    if a.dry_run:
        return
    if C.IMPORT_ERROR is not None:
        sys.exit("compare.py: %s (torch and the fattn library are needed; --dry-run runs without)" % C.IMPORT_ERROR)
    ctx = fattn.Context(fattn.BACKEND_CUDA, 0)
    C.init_clocks(a)
    if a.no_pdl:
        ctx.set_option(fattn.OPTION_DISABLE_PDL, 1)
    engine = C.fattn_engine(ctx)
    print("device: %s, torch %s, cuDNN %s, fattn %s (%s); backend order %s, settle %.0f ms, cool-down %.0f ms "
          "per turn" % (torch.cuda.get_device_name(), torch.__version__, torch.backends.cudnn.version(),
                        fattn.__version__, fattn.library_path, a.order, a.settle_ms, a.cooldown_ms))
    for n, f, info in (("fa3", fa3, fa3_info), ("fa4", fa4, fa4_info)):
        if n in want:
            print("%s: %s" % (VAR_LABEL[n], info if f is not None else "n/a (%s); its cells read n/a" % info))
    if mode == "bwd":
        print("backward: fattn_bwd alone on one fattn forward's O and LSE (with the sink: dsink too); the peers "
              "torch.autograd.grad(O, (q, k, v[, sink]), dO, retain_graph=True) on one forward's graph")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "fattn_version": fattn.__version__, "fattn_library": fattn.library_path, "fattn_engine": engine,
           "variants": mode,
           "flops": "2*b*h*(d+dv)*entries; entries = sq*sk (halved causal), with a window the unmasked pairs" +
                    ("; backward x %.1f" % C.BWD_FLOPS if mode == "bwd" else ""),
           "tile": TILE[mode], "pdl": not a.no_pdl, "backends": backends,
           "fa3_version": fa3_info if fa3 else None, "fa4_version": fa4_info if fa4 else None,
           "order": a.order, "rounds": a.rounds, "iters": a.iters, "settle_ms": a.settle_ms,
           "cooldown_ms": a.cooldown_ms, "estimate_s": round(est), "results": []}
    peers = [n for n in backends if n in ("cudnn", "fa3", "fa4")]
    segs = [("TFLOPs/s", " ".join("%7s" % VAR_LABEL[n] for n in backends)),
            ("fattn time /", "%7s %7s" % ("plain", "bound")),
            ("fattn TFLOPs/s /", " ".join("%7s" % VAR_LABEL[n] for n in peers))]
    lead = "%-7s %7s %-6s %6s %2s %3s" % ("variant", "d/dv", "mask", "seqlen", "b", "h")
    hdr = lead + "".join(" | " + s for _, s in segs)
    print("\n%s (bf16)\n" % ("backward" if mode == "bwd" else "forward") + " " * len(lead) +
          "".join(" | " + t.center(len(s)) for t, s in segs) + "\n" + hdr + "\n" + "-" * len(hdr))
    errors_seen = set()
    for r in rows:
        res = bench_variant_case(ctx, r, mode, a, backends, fa3, fa4)
        out["results"].append(res)
        out["elapsed_s"] = round(time.perf_counter() - C.T0)
        if a.json:  # after every row, so a command stopped at its time limit keeps the rows it measured
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        print(row_label(r) + " | " + " ".join(cell(res, n) for n in backends) + " | " +
              "%s %s" % (C.fmt(res.get("t_over_plain"), "%7.3f"), C.fmt(res.get("bound"), "%7.3f")
                         if r.window is not None else "-".rjust(7)) + " | " +
              " ".join(C.fmt(res.get("fattn_over_" + n), "%7.3f") if C.key(n) + "_na" not in res else "-".rjust(7)
                       for n in peers), flush=True)
        for n in backends:
            e = res.get(C.key(n) + "_error")
            if e and (n, e) not in errors_seen:  # each backend's distinct message once
                errors_seen.add((n, e))
                print("      %s: %s" % (VAR_LABEL[n], e), flush=True)
        warn = C.BWD_MAXDIFF_WARN if mode == "bwd" else C.MAXDIFF_WARN
        off = ["%s %.3g" % (VAR_LABEL[n], res[C.key(n) + "_maxdiff"]) for n in peers
               if (res.get(C.key(n) + "_maxdiff") or 0) > warn]
        if off:
            print("      against fattn's %s above %.2f: %s" % ("dQ, dK, dV (relative)" if mode == "bwd" else "O", warn,
                                                             ", ".join(off)), flush=True)
        if a.clocks:
            print("      SM MHz / W (median while running): " + ", ".join(
                "%s %s / %s" % (VAR_LABEL[n], "%.0f" % res[C.key(n) + "_mhz"] if C.key(n) + "_mhz" in res else "-",
                                "%.0f" % res[C.key(n) + "_w"] if C.key(n) + "_w" in res else "-") for n in backends),
                flush=True)
    out["elapsed_s"] = round(time.perf_counter() - C.T0)
    print()
    for n in peers:
        ms = [x[C.key(n) + "_maxdiff"] for x in out["results"] if x.get(C.key(n) + "_maxdiff") is not None]
        if ms:
            print("largest %s against fattn's of %s: %.3g" % (
                "relative difference of dQ, dK, dV (and dsink)" if mode == "bwd" else "|O - O|", VAR_LABEL[n],
                max(ms)))
    print_targets(out["results"], mode)
    print("done in %.0f s (estimate %.0f s)" % (out["elapsed_s"], est))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def print_targets(results, mode):
    """Issue 37's targets, row by row (the issue states them at d128 causal 16k, the window at 32k)."""
    print("issue 37's targets (%s; bound = fattn time / (plain time x tile fraction)):" % mode)
    for res in results:
        r = VRow(res["kind"], res["head_dim"], res["head_dim_v"], res["causal"], res["seqlen"], res["batch"],
                 res["heads"], res["window"], res["softcap"], res["sink"])
        parts = []
        for what, op, bound in TARGETS[(r.kind, mode)]:
            v = metric(res, what)
            name = "x " + VAR_LABEL[what] if what in VAR_LABEL else what
            if v is None:
                parts.append("%s n/a" % name)
            else:
                ok = v <= bound if op == "<=" else v >= bound
                parts.append("%s %.3f (%s %.2f: %s)" % (name, v, op, bound, "met" if ok else "NOT met"))
        print("  %s: %s" % (row_label(r), "; ".join(parts)))


# ------------------------------------------------------------------ --variants --cpu-check

def reference(q, k, v, r, sink, scale):
    """The variant's attention in float64 torch on [b, s, h, d] tensors: O [b, s, h, dv]."""
    sq, sk = q.shape[1], k.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if r.softcap:
        s = r.softcap * torch.tanh(s / r.softcap)
    j = torch.arange(sk)[None, :]
    lo, hi = (torch.tensor([key_range(x, sq, sk, r.causal, r.window)[t] for x in range(sq)])[:, None] for t in (0, 1))
    s = s.masked_fill(~((j >= lo) & (j <= hi)), float("-inf"))
    if sink is not None:  # one more logit per row that takes probability but has no value
        s = torch.cat([s, sink[None, :, None, None].expand(s.shape[0], -1, sq, 1)], -1)
    p = torch.softmax(s, -1)[..., :sk]
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def cpu_check(a):
    """--variants --cpu-check: every kind's row at a small size (seqlen 384, window (96, 0), 2 heads) built by
    VariantCase on the CPU engine in float32: fattn's and fattn-plain's O, dQ, dK, dV (and dsink) against
    reference's through torch autograd in float64; score_entries and tiles_visited against a brute-force count;
    the peers' keyword arguments printed.  Exits 1 on a mismatch."""
    if C.IMPORT_ERROR is not None:
        sys.exit("compare.py: %s (--cpu-check needs torch and the fattn library)" % C.IMPORT_ERROR)
    ctx = fattn.Context(fattn.BACKEND_CPU, 0)
    bad, seen = 0, set()
    for r in variant_rows(KINDS, "both", 16384, 2048):
        small = r._replace(s=384, b=1, h=2, window=(96, 0) if r.window else None)
        if small in seen:  # the rows that differ only in seqlen
            continue
        seen.add(small)
        for mode in ("fwd", "bwd"):
            res = bench_variant_case(ctx, small, mode, a, list(VAR_BACKENDS), device="cpu", dtype=torch.float32,
                                     timed=False)
            case = VariantCase(ctx, small, mode, ("fattn", "fattn-plain"), 7, torch.float32, device="cpu")
            worst = 0.0
            for name, rr in (("fattn", small), ("fattn-plain", plain(small))):
                if name not in case.calls:
                    print("  %s %s: %s" % (name, mode, C.short_error(case.errors[name])))
                    bad += 1
                    continue
                case.calls[name][0]()
                v = case.v if name == "fattn" else case.v_plain
                dout = case.dout if name == "fattn" else case.dout_plain
                q, k, v64 = (x.detach().double().requires_grad_() for x in (case.q, case.k, v))
                sink = case.sink.double().requires_grad_() if rr.sink else None
                o = reference(q, k, v64, rr, sink, case.scale)
                if mode == "fwd":
                    got, want = [case.outs[name]], [o]
                else:
                    want = torch.autograd.grad(o, [q, k, v64] + ([sink] if sink is not None else []), dout.double())
                    got = case.outs[name]
                    if len(got) != len(want):
                        print("  %s %s: %d gradients, the reference has %d" % (name, mode, len(got), len(want)))
                        bad += 1
                worst = max(worst, C.grad_maxdiff([g.double() for g in got], [w.detach() for w in want]))
            ok = worst < 1e-4
            bad += not ok
            peers = {n: res.get(C.key(n) + "_na") or res.get(C.key(n) + "_error") for n in ("cudnn", "fa3", "fa4")}
            print("%s %s: fattn and plain against float64 torch, max relative %.2e %s; FLOP %.4g (plain %.4g)%s; "
                  "peers: %s" % (row_label(small), mode, worst, "ok" if ok else "MISMATCH",
                                 variant_flops(small, mode), variant_flops(plain(small), mode),
                                 ", tile fraction %.4f" % res["tile_fraction"] if "tile_fraction" in res else "",
                                 "; ".join("%s: %s" % (VAR_LABEL[n], e) for n, e in peers.items())))
            for n in ("fattn", "fattn-plain"):
                if res.get(C.key(n) + "_error"):
                    print("  %s: %s" % (n, res[C.key(n) + "_error"]))
                    bad += 1
        print("    fa3 %s\n    fa4 %s" % (fa3_kwargs(r, r.d ** -0.5) if r.kind in PEER_KINDS["fwd"]["fa3"] else "-",
                                         fa4_kwargs(r, r.d ** -0.5, "<sink float32 [%d]>" % r.h if r.sink else None)))
    for r in [x._replace(s=s, window=w) for x in variant_rows(("window",), "1")[:1]
              for s, w in ((300, (64, 0)), (1000, (200, 0)), (513, (0, 0)))]:
        i = torch.arange(r.s)[:, None]
        j = torch.arange(r.s)[None, :]
        m = (j <= i) & (j >= i - r.window[0])
        entries = int(m.sum())
        ok = entries == score_entries(r)
        for bm, bn in (TILE["fwd"], TILE["bwd"], (64, 176)):
            nq, nk = -(-r.s // bm), -(-r.s // bn)
            pad = torch.zeros(nq * bm, nk * bn, dtype=torch.bool)
            pad[:r.s, :r.s] = m
            tiles = int(pad.view(nq, bm, nk, bn).any(3).any(1).sum())
            ok = ok and tiles == tiles_visited(r, bm, bn)
        bad += not ok
        print("seqlen %d window %s: entries %d, tiles by brute force %s" % (r.s, r.window, entries,
                                                                             "agree" if ok else "DISAGREE"))
    print("cpu check: %s" % ("all agree" if not bad else "%d MISMATCHES" % bad))
    sys.exit(1 if bad else 0)
