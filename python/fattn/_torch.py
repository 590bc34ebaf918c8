"""_torch.py - fattn on torch tensors: the custom ops <ns>::fwd, <ns>::bwd,
<ns>::fwd_fp8, <ns>::fwd_kvcache, <ns>::fwd_varlen and <ns>::bwd_varlen
(torch.library, with fake implementations for torch.compile), autograd through
fattn_bwd (fwd_fp8 is forward only: its backward raises; fwd_kvcache, decoding,
has none; fwd_varlen's goes through bwd_varlen, seqused_q and seqused_k included).

Every op takes fattn.h's variants as its last arguments, with defaults that
mean none: window_left, window_right (-1, -1: no window), softcap (0: off) and
learnable_sink (None, or float32 [hq] on q's device).  The backward ops return
d(learnable_sink) too (fattn_bwd's dsink), an empty tensor when no sink is
given.

<ns> is the package's name: "fattn", or "fattn_b" when bench/compare.py loads
a second copy of these bindings beside the first (an op name is registered
once per process).
"""
import math
from typing import Optional, Tuple

import torch

from . import _core

_NS = __name__.split(".")[0]

if not hasattr(torch.library, "custom_op"):
    raise ImportError("fattn's torch integration needs torch >= 2.4 (torch.library.custom_op); found %s"
                      % torch.__version__)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _context(device):
    if device.type == "cpu":
        return _core.context(_core.BACKEND_CPU)
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if (_core.BACKEND_CUDA, idx) not in _core._contexts and torch.cuda.is_current_stream_capturing():
            # fattn_ctx_create allocates device memory (cudaMalloc) and waits for a
            # memset: CUDA forbids both during a capture in torch's default error
            # mode ("global"), the call would fail and invalidate the whole capture
            # (a CUDA error, then another at capture_end).  Refuse before touching
            # the capture instead (test_torch.CudaGraph).
            raise RuntimeError("fattn: the first fattn call on cuda:%d is being captured into a CUDA graph; creating "
                               "fattn's context for the device allocates memory, which a capture forbids. Make one "
                               "call of the same shape before the capture (a warm-up, as torch's CUDA graphs docs "
                               "advise: it also makes the workspaces that captured calls use)" % idx)
        return _core.context(_core.BACKEND_CUDA, idx)
    raise NotImplementedError("fattn: tensors on %s: fattn computes on CUDA devices and the CPU" % device)


def _on_current_stream(ctx, device):
    """Call under ctx._lock: the stream set here is the one the call then uses."""
    if device.type == "cuda":
        ctx.set_stream(torch.cuda.current_stream(device).cuda_stream)


def _readable(t, name):
    """(tensor, Desc): t itself when fattn can read its layout, else a packed copy
    (a head dim that is not contiguous, an expanded (stride 0) dimension, ...)."""
    d = _core.describe(t, name)
    if d.c_strides is None:
        t = t.contiguous()
        d = _core.describe(t, name)
    return t, d


def _new_outputs(shapes, q, out=None, sink=None):
    """(out, lse) of a forward of `shapes` (a _core.Dims or VarlenDims): out (given, or
    new in q's dtype) and lse float32 on q's device; 0 and -inf (the sink, when one is
    given: fattn.h's rule for a row that sees no key) when there is nothing to compute
    (shapes.empty: fattn is then not called)."""
    if out is None:
        out = torch.empty(shapes.o_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(shapes.lse_shape, dtype=torch.float32, device=q.device)
    if shapes.empty:
        out.zero_()
        if sink is not None and lse.numel():  # lse [b, hq, sq], or [hq, total_q] when varlen
            lse.copy_((sink.view(1, -1, 1) if lse.dim() == 3 else sink.view(-1, 1)).expand(lse.shape))
        else:
            lse.fill_(-math.inf)
    return out, lse


def _op_sink(learnable_sink, q):
    """An op's learnable_sink as fattn reads it: None, or a contiguous float32 [hq]
    tensor on q's device (a copy when needed); ValueError otherwise (a direct op call:
    fattn.attention checks it first)."""
    if learnable_sink is None:
        return None
    hq = q.shape[-2]
    if tuple(learnable_sink.shape) != (hq,) or not learnable_sink.is_floating_point() \
            or learnable_sink.device != q.device:
        raise ValueError("fattn: learnable_sink must be a float tensor of shape (%d,) on %s, got %s %s on %s"
                         % (hq, q.device, learnable_sink.dtype, tuple(learnable_sink.shape), learnable_sink.device))
    return learnable_sink.to(torch.float32).contiguous()


def _variants(window_left, window_right, softcap, sink):
    """_core.Variants of an op's variant arguments (sink: _op_sink's)."""
    ws = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    return _core.Variants(ws, softcap, sink.data_ptr() if sink is not None else None)


def _fwd_fake_outputs(q, v):
    """The fake outputs of a forward on 4-D (or, varlen, 3-D packed) q and v."""
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    return q.new_empty(q.shape[:-1] + (v.shape[-1],)), q.new_empty(lse_shape, dtype=torch.float32)


def _run_fwd(ctx, dims, q, k, v, out, lse, causal, softmax_scale, fp8=None, varlen=None, seqused_k=None,
             variants=_core.NO_VARIANTS, seqused_q=None):
    """fattn_fwd (fattn_fwd_fp8 when fp8 is a _core.FP8) of 4-D q, k, v into out and
    lse, on ctx (None: the shared context of the tensors' device) and torch's current
    stream.  varlen, seqused_k, variants: _core.run_fwd's."""
    if ctx is None:
        ctx = _context(q.device)
    q, qd = _readable(q, "q")
    k, kd = _readable(k, "k")
    v, vd = _readable(v, "v")
    od = _core.describe(out, "out")
    with ctx._lock:
        _on_current_stream(ctx, q.device)
        if fp8 is not None:
            _core.run_fwd_fp8(ctx, dims, qd, kd, vd, od, lse.data_ptr(), causal, softmax_scale, fp8, variants)
        else:
            _core.run_fwd(ctx, dims, qd, kd, vd, od, lse.data_ptr(), causal, softmax_scale, varlen, seqused_k,
                          variants, seqused_q)


def _fwd_impl(q, k, v, causal, softmax_scale, fp8, ctx=None, out=None, window_left=-1, window_right=-1,
              softcap=0.0, sink=None):
    """fp8: None (the 16-bit/f32 forward) or a _core.FP8 (fattn_fwd_fp8); the
    variants: the ops' (sink: _op_sink's)."""
    dims = _core.check_shapes(q.shape, k.shape, v.shape)
    out, lse = _new_outputs(dims, q, out, sink)
    if not dims.empty:
        _run_fwd(ctx, dims, q, k, v, out, lse, causal, softmax_scale, fp8,
                 variants=_variants(window_left, window_right, softcap, sink))
    return out, lse


@torch.library.custom_op(_NS + "::fwd", mutates_args=())
def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float, fp8: bool,
        deterministic: bool, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
        learnable_sink: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out [b, sq, hq, dv] in q's dtype, lse [b, hq, sq] float32, the sink included).
    `deterministic` is kept for the backward (FlashAttention's flag; the CPU engine
    always is).  fp8=True is fwd_fp8 with fattn.FP8()'s defaults (forward only).
    window_left, window_right ((-1, -1) none, -1 unbounded on a side), softcap (0 off)
    and learnable_sink (None or float [hq] on q's device): fattn.h's variants; the
    backward gives d(learnable_sink) too."""
    return _fwd_impl(q, k, v, causal, softmax_scale, _core.FP8() if fp8 else None, None, None, window_left,
                     window_right, softcap, _op_sink(learnable_sink, q))


@fwd.register_fake
def _fwd_fake(q, k, v, *rest):
    return _fwd_fake_outputs(q, v)


def _seed_to_op(seed):
    """An op's int is int64: a uint64 seed travels as its two's complement."""
    return seed - 2 ** 64 if seed >= 2 ** 63 else seed


@torch.library.custom_op(_NS + "::fwd_fp8", mutates_args=())
def fwd_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
            granularity: str, block_q: int, block_k: int, block_v: int, rotate: bool,
            seed: int, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
            learnable_sink: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention (fattn_fwd_fp8): q, k, v f32/f16/bf16 quantised to e4m3 as
    fattn.FP8(granularity, block_q, block_k, block_v, rotate, seed) says (seed
    as int64: a seed >= 2**63 is passed as seed - 2**64), then the e4m3
    forward, with fwd's variants.  (out in q's dtype, lse float32).  Forward only."""
    cfg = _core.FP8(granularity, block_q, block_k, block_v, rotate, seed % 2 ** 64)
    return _fwd_impl(q, k, v, causal, softmax_scale, cfg, None, None, window_left, window_right, softcap,
                     _op_sink(learnable_sink, q))


@fwd_fp8.register_fake
def _fwd_fp8_fake(q, k, v, *rest):
    return _fwd_fake_outputs(q, v)


def _sink_tensor(learnable_sink, q):
    """fattn.attention's learnable_sink checked, as float32 [hq] on q's device (a
    differentiable conversion: the gradient flows back to the caller's tensor in its
    own dtype), or None."""
    if learnable_sink is None:
        return None
    hq = q.shape[-2]
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError("fattn: learnable_sink must be a torch tensor with q, got a %s"
                        % type(learnable_sink).__name__)
    if tuple(learnable_sink.shape) != (hq,) or not learnable_sink.is_floating_point():
        raise ValueError("fattn: learnable_sink must be a float tensor of shape (%d,) (one logit per query head), "
                         "got %s %s" % (hq, learnable_sink.dtype, tuple(learnable_sink.shape)))
    if learnable_sink.device != q.device:
        raise ValueError("fattn: learnable_sink is on %s, q on %s" % (learnable_sink.device, q.device))
    return learnable_sink.to(torch.float32).contiguous()


def _fp8_setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])


def _fp8_backward(ctx, dout, dlse):
    # fattn.attention refuses inputs that require grad before the call; this
    # is for a direct torch.ops.fattn.fwd_fp8 call: an error, never a gradient
    raise _core.fp8_grad_error()


fwd_fp8.register_autograd(_fp8_backward, setup_context=_fp8_setup_context)


def _bwd_impl(shapes, dout, q, k, v, out, lse, causal, softmax_scale, deterministic, varlen=None, window_left=-1,
              window_right=-1, softcap=0.0, sink=None, seqused_q=None, seqused_k=None):
    """(dq, dk, dv, dsink): dq, dk, dv shaped and typed like q, k, v, through fattn_bwd,
    and dsink float32 [hq] when a sink is given (_op_sink's; else an empty tensor);
    shapes: the call's _core.Dims, or its VarlenDims with varlen (a _core.Varlen): the
    packed 3-D tensors are then described as batch 1.  seqused_q, seqused_k: contiguous
    int32 [batch] tensors or None (varlen); fattn_bwd leaves the rows past them unwritten,
    and their gradient is 0, so the gradients then start as zeros."""
    new = torch.zeros if seqused_q is not None or seqused_k is not None else torch.empty
    dq, dk, dv = (new(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = torch.empty((q.shape[-2] if sink is not None else 0,), dtype=torch.float32, device=q.device)
    if shapes.empty:  # no key anywhere: o = 0, so every gradient is 0
        for g in (dq, dk, dv, dsink):
            g.zero_()
        return dq, dk, dv, dsink
    as4 = (lambda t: t.unsqueeze(0)) if varlen is not None else (lambda t: t)
    dims = shapes.dims if varlen is not None else shapes
    ctx = _context(q.device)
    ts = [_readable(as4(t), n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout"))]
    lse = lse.contiguous()
    gd = [_core.describe(as4(g), n) for g, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
    try:
        with ctx._lock:
            _on_current_stream(ctx, q.device)
            _core.run_bwd(ctx, dims, *[d for _, d in ts], *gd, lse.data_ptr(), causal, softmax_scale, deterministic,
                          varlen, _variants(window_left, window_right, softcap, sink),
                          dsink.data_ptr() if sink is not None else None,
                          *(t.data_ptr() if t is not None else None for t in (seqused_q, seqused_k)))
    except _core.FattnUnsupportedError as e:
        if q.is_cuda:
            raise type(e)(e.status, "fattn backward on CUDA tensors: %s (CPU tensors are differentiable "
                          "in every configuration)" % e.detail) from None
        raise
    return dq, dk, dv, dsink


@torch.library.custom_op(_NS + "::bwd", mutates_args=())
def bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, causal: bool, softmax_scale: float, deterministic: bool, window_left: int = -1,
        window_right: int = -1, softcap: float = 0.0,
        learnable_sink: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink) through fattn_bwd: dq, dk, dv shaped and typed like q, k, v;
    dsink float32 [hq], d(learnable_sink), when learnable_sink is given, else an empty
    tensor (dq, dk, dv need only the forward's sink-inclusive out and lse: pass the
    sink only for its gradient).  The variants as the forward's."""
    dims = _core.check_shapes(q.shape, k.shape, v.shape)
    return _bwd_impl(dims, dout, q, k, v, out, lse, causal, softmax_scale, deterministic, None, window_left,
                     window_right, softcap, _op_sink(learnable_sink, q))


def _grad_fakes(q, k, v, sink):
    """The fake gradients of a backward op: shaped like q, k, v; dsink [hq] with a sink, else [0]."""
    return tuple(t.new_empty(t.shape) for t in (q, k, v)) + (
        q.new_empty((q.shape[-2] if sink is not None else 0,), dtype=torch.float32),)


def _bwd_fake(dout, q, k, v, *rest):
    """The fake of bwd: learnable_sink is its last argument."""
    return _grad_fakes(q, k, v, rest[-1] if rest and isinstance(rest[-1], torch.Tensor) else None)


bwd.register_fake(_bwd_fake)


def _wants_dsink(ctx, index, sink):
    """Whether the backward must give d(learnable_sink), the op's argument `index`
    (needs_input_grad covers the arguments the call passed)."""
    return sink is not None and len(ctx.needs_input_grad) > index and ctx.needs_input_grad[index]


def _setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, fp8, deterministic = inputs[:7]
    wl, wr, softcap, sink = (tuple(inputs[7:]) + (-1, -1, 0.0, None)[len(inputs) - 7:])
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, sink)
    ctx.causal, ctx.softmax_scale, ctx.fp8, ctx.deterministic = causal, softmax_scale, fp8, deterministic
    ctx.variants = (wl, wr, softcap)
    # The LSE is returned without a gradient (as FlashAttention's): fattn_bwd
    # takes no dlse.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    if ctx.fp8:
        raise _core.fp8_grad_error()
    q, k, v, o, lse, sink = ctx.saved_tensors
    want = _wants_dsink(ctx, 10, sink)
    dq, dk, dv, dsink = bwd(dout, q, k, v, o, lse, ctx.causal, ctx.softmax_scale, ctx.deterministic, *ctx.variants,
                            sink if want else None)
    return (dq, dk, dv) + (None,) * 7 + (dsink if want else None,)


fwd.register_autograd(_backward, setup_context=_setup_context)


def _check_inputs(q, k, v):
    for n, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("fattn: q is a torch tensor but %s is a %s" % (n, type(t).__name__))
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError("fattn: %s has dtype %s; fattn takes float32, float16 and bfloat16 tensors "
                            "(fp8 quantises them to e4m3 itself)" % (n, t.dtype))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError("fattn: q, k and v must have one dtype, got %s, %s and %s" % (q.dtype, k.dtype, v.dtype))
    if not (q.device == k.device == v.device):
        raise ValueError("fattn: q, k and v must be on one device, got %s, %s and %s"
                         % (q.device, k.device, v.device))
    if q.device.type not in ("cpu", "cuda"):
        raise NotImplementedError("fattn: tensors on %s: fattn computes on CUDA devices and the CPU" % q.device)


def _requires_grad(*ts):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def attention(q, k, v, causal, softmax_scale, fp8, return_lse, out, ctx, deterministic=False, window_size=None,
              softcap=0.0, learnable_sink=None):
    """window_size: None or (left, right) (_core.check_window_size's); softcap,
    learnable_sink: fattn.attention's."""
    _check_inputs(q, k, v)
    dims = _core.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    scale = _core.resolve_scale(softmax_scale, dims.d)
    fp8 = _core.fp8_config(fp8)
    sink = _sink_tensor(learnable_sink, q)
    grad = _requires_grad(q, k, v, sink)
    if fp8 is not None and grad:
        raise _core.fp8_grad_error()
    wl, wr = window_size if window_size is not None else (-1, -1)
    var = (int(wl), int(wr), float(softcap), sink)
    if out is None and ctx is None:
        if fp8 is not None:
            o, lse = fwd_fp8(q, k, v, bool(causal), scale, fp8.granularity, fp8.block_q, fp8.block_k, fp8.block_v,
                             fp8.rotate, _seed_to_op(fp8.seed), *var)
        else:
            o, lse = fwd(q, k, v, bool(causal), scale, False, bool(deterministic), *var)
        return (o, lse) if return_lse else o

    # out= or ctx=: a direct call, outside autograd and torch.compile
    if grad:
        raise RuntimeError("fattn.attention(out=..., ctx=...) does not support autograd (the inputs require "
                           "grad); leave out and ctx unset")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != q.dtype or out.device != q.device \
                or tuple(out.shape) != dims.o_shape:
            raise ValueError("fattn: out must be a %s tensor of shape %s on %s, got %s"
                             % (q.dtype, dims.o_shape, q.device,
                                "%s %s on %s" % (out.dtype, tuple(out.shape), out.device)
                                if isinstance(out, torch.Tensor) else type(out).__name__))
        od = _core.describe(out, "out")
        if od.c_strides is None or not _core.non_overlapping(od.shape, od.strides):
            raise ValueError("fattn: out must be non-overlapping with its head dim contiguous, got strides %s"
                             % (tuple(out.stride()),))
    if ctx is not None:
        want = _core.BACKEND_CUDA if q.is_cuda else _core.BACKEND_CPU
        if ctx.backend != want or (q.is_cuda and q.device.index not in (None, ctx.device)):
            raise ValueError("fattn: ctx computes on %s but the tensors are on %s"
                             % ("cuda:%d" % ctx.device if ctx.backend == _core.BACKEND_CUDA else "the CPU", q.device))
    with torch.no_grad():
        o, lse = _fwd_impl(q, k, v, bool(causal), scale, fp8, ctx, out, *var[:3],
                           sink.detach() if sink is not None else None)
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------
# e4m3 inputs with FlashAttention-3's descales (fattn_fwd on e4m3 tensors with one
# scale per batch entry and head: a scale_block covering the sequence, fattn.h)
# ---------------------------------------------------------------------------

def _head_scales(descale, b, hkv, group, device, name):
    """FA3's descale ([b, hkv] float32, or None = 1) as fattn's per-head scales:
    contiguous float32 [b, hkv * group] (q's heads repeat their kv head's)."""
    if descale is None:
        return torch.ones((b, hkv * group), dtype=torch.float32, device=device)
    if not isinstance(descale, torch.Tensor) or tuple(descale.shape) != (b, hkv) or descale.device != device:
        raise ValueError("fattn: %s must be a float32 tensor of shape (%d, %d) (batch, kv heads) on %s, got %s"
                         % (name, b, hkv, device, "%s %s on %s" % (descale.dtype, tuple(descale.shape),
                                                                    descale.device)
                            if isinstance(descale, torch.Tensor) else type(descale).__name__))
    d = descale.to(torch.float32)
    return (d.repeat_interleave(group, dim=1) if group > 1 else d).contiguous()


@torch.library.custom_op(_NS + "::fwd_e4m3", mutates_args=())
def fwd_e4m3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: Optional[torch.Tensor],
             k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor], causal: bool,
             softmax_scale: float, out_bf16: bool = True, window_left: int = -1,
             window_right: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out [b, sq, hq, dv] bf16 (f16 with out_bf16=False), lse [b, hq, sq] float32) of
    e4m3 q, k, v [b, s, h, d] whose real values are code x descale[b, kv head] (FA3's
    q/k/v_descale, float32 [b, hkv]; None = 1): fattn_fwd on the e4m3 tensors with one
    scale per batch entry and head (scale_block covering the sequence).  Forward only,
    as FA3's FP8 kernel."""
    dims = _core.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    group = dims.hq // dims.hkv
    qs = _head_scales(q_descale, dims.b, dims.hkv, group, q.device, "q_descale")
    ks = _head_scales(k_descale, dims.b, dims.hkv, 1, q.device, "k_descale")
    vs = _head_scales(v_descale, dims.b, dims.hkv, 1, q.device, "v_descale")
    out = torch.empty(dims.o_shape, dtype=torch.bfloat16 if out_bf16 else torch.float16, device=q.device)
    out, lse = _new_outputs(dims, out, out)
    if dims.empty:
        return out, lse
    ctx = _context(q.device)
    q, qd = _readable(q, "q")
    k, kd = _readable(k, "k")
    v, vd = _readable(v, "v")
    od = _core.describe(out, "out")
    ws = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    a = _core.fwd_struct(dims, qd, kd, vd, od, lse.data_ptr(), causal, softmax_scale,
                         variants=_core.Variants(ws, 0.0, None))
    a.q = _core.tensor_struct(qd, qs.data_ptr(), max(dims.sq, 1))
    a.k = _core.tensor_struct(kd, ks.data_ptr(), max(dims.sk, 1))
    a.v = _core.tensor_struct(vd, vs.data_ptr(), max(dims.sk, 1))
    with ctx._lock:
        _on_current_stream(ctx, q.device)
        ctx.fwd_raw(a)
    return out, lse


@fwd_e4m3.register_fake
def _fwd_e4m3_fake(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, out_bf16=True, *rest):
    o, lse = _fwd_fake_outputs(q, v)
    return o.to(torch.bfloat16 if out_bf16 else torch.float16), lse


# As FA3's FP8 call: inputs that require grad run the forward; a backward through it raises
fwd_e4m3.register_autograd(_fp8_backward, setup_context=_fp8_setup_context)


def attention_e4m3(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, window_size=None):
    """flash_attn_func's e4m3 path: (out bf16, lse)."""
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError("fattn: %s has dtype %s; with e4m3 q, k and v all three must be float8_e4m3fn" % (n, t.dtype))
    dims = _core.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    wl, wr = window_size if window_size is not None else (-1, -1)
    return fwd_e4m3(q, k, v, q_descale, k_descale, v_descale, bool(causal),
                    _core.resolve_scale(softmax_scale, dims.d), True, int(wl), int(wr))


_INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)


def _int32_on(t, name, device, shape):
    """t as a contiguous int32 tensor on `device` of `shape` (a device-side
    conversion of another integer dtype, which keeps every valid length or
    page index); TypeError / ValueError otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("fattn: %s must be a torch tensor (int32), got a %s" % (name, type(t).__name__))
    if t.dtype not in _INT_DTYPES:
        raise TypeError("fattn: %s must be an int32 tensor, got %s" % (name, t.dtype))
    if t.device != device:
        raise ValueError("fattn: %s is on %s, the tensors on %s" % (name, t.device, device))
    if tuple(t.shape) != shape:
        raise ValueError("fattn: %s must have shape %s, got %s" % (name, shape, tuple(t.shape)))
    return t.to(torch.int32).contiguous()



# ---------------------------------------------------------------------------
# Variable-length batches: fattn_fwd / fattn_bwd with cu_seqlens;
# fattn.flash_attn_varlen_func
# ---------------------------------------------------------------------------

def _varlen_indices(device, cu_seqlens_q, cu_seqlens_k, seqused_k=None):
    """The batch of a variable-length call, len(cu_seqlens_q) - 1, after the checks that
    read no entry (the entries may be device memory; the CPU engine checks them on the
    host): cu_seqlens_q and cu_seqlens_k contiguous 1-D int32 tensors of one length
    >= 2 on `device`, seqused_k (optional) a contiguous int32 tensor [batch] there.
    TypeError for a non-tensor, ValueError otherwise."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
        if t is None and name == "seqused_k":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError("fattn: %s must be an int32 torch tensor, got a %s" % (name, type(t).__name__))
        want = "[batch + 1] (batch >= 1)" if name != "seqused_k" else "[batch]"
        if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous() or t.device != device \
                or (name != "seqused_k" and t.shape[0] < 2):
            raise ValueError("fattn: %s must be a contiguous 1-D int32 tensor %s on %s, got %s %s%s on %s"
                             % (name, want, device, t.dtype, tuple(t.shape),
                                "" if t.is_contiguous() else " (not contiguous)", t.device))
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError("fattn: cu_seqlens_q has %d entries but cu_seqlens_k %d (both are [batch + 1])"
                         % (cu_seqlens_q.shape[0], cu_seqlens_k.shape[0]))
    batch = cu_seqlens_q.shape[0] - 1
    if seqused_k is not None and seqused_k.shape[0] != batch:
        raise ValueError("fattn: seqused_k has %d entries, the batch (len(cu_seqlens_q) - 1) %d"
                         % (seqused_k.shape[0], batch))
    return batch


def _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k):
    batch = _varlen_indices(q.device, cu_seqlens_q, cu_seqlens_k, seqused_k)
    return _core.check_varlen_shapes(q.shape, k.shape, v.shape, batch, max_seqlen_q, max_seqlen_k)


def _varlen_fields(shapes, cu_seqlens_q, cu_seqlens_k):
    return _core.Varlen(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), shapes.total_q, shapes.total_k)


@torch.library.custom_op(_NS + "::fwd_varlen", mutates_args=())
def fwd_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
               causal: bool, softmax_scale: float, deterministic: bool, window_left: int = -1, window_right: int = -1,
               softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
               seqused_q: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """A variable-length batch (fattn_fwd with cu_seqlens): q [total_q, hq, d], k [total_k, hkv, d],
    v [total_k, hkv, dv] packed, sequence b at rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 (k, v:
    cu_seqlens_k), int32 [batch + 1]; max_seqlen_q/k the longest lengths; seqused_k (int32 [batch] or
    None): sequence b uses its first seqused_k[b] keys only.  (out [total_q, hq, dv] in q's dtype, lse
    [hq, total_q] float32, the sink included).  `deterministic` is kept for the backward.  The variants
    as fwd's, per sequence (its own lengths).  seqused_q (int32 [batch] or None): sequence b computes its
    first seqused_q[b] queries only, the other rows of out and lse left unwritten (FA3's: they promise
    nothing there).  Both reach the backward (bwd_varlen), whose gradients are 0 on the unused rows."""
    shapes = _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    sink = _op_sink(learnable_sink, q)
    out, lse = _new_outputs(shapes, q, None, sink)
    if not shapes.empty:
        _run_fwd(None, shapes.dims, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out.unsqueeze(0), lse, causal,
                 softmax_scale, varlen=_varlen_fields(shapes, cu_seqlens_q, cu_seqlens_k),
                 seqused_k=seqused_k.data_ptr() if seqused_k is not None else None,
                 variants=_variants(window_left, window_right, softcap, sink),
                 seqused_q=seqused_q.data_ptr() if seqused_q is not None else None)
    return out, lse


@fwd_varlen.register_fake
def _fwd_varlen_fake(q, k, v, *rest):
    return _fwd_fake_outputs(q, v)


@torch.library.custom_op(_NS + "::bwd_varlen", mutates_args=())
def bwd_varlen(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
               max_seqlen_k: int, causal: bool, softmax_scale: float, deterministic: bool, window_left: int = -1,
               window_right: int = -1, softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
               seqused_q: Optional[torch.Tensor] = None, seqused_k: Optional[torch.Tensor] = None
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink) of fwd_varlen, as bwd's, through fattn_bwd with the same cu_seqlens
    (dsink sums the used rows of every sequence) and the forward's seqused_q / seqused_k (int32
    [batch] or None): the rows of dq past a sequence's used queries and of dk, dv past its used
    keys are 0."""
    shapes = _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    if seqused_q is not None:
        seqused_q = _int32_on(seqused_q, "seqused_q", q.device, (shapes.dims.b,))
    return _bwd_impl(shapes, dout, q, k, v, out, lse, causal, softmax_scale, deterministic,
                     _varlen_fields(shapes, cu_seqlens_q, cu_seqlens_k), window_left, window_right, softcap,
                     _op_sink(learnable_sink, q), seqused_q, seqused_k)


@bwd_varlen.register_fake
def _bwd_varlen_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                     softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0, learnable_sink=None,
                     seqused_q=None, seqused_k=None):
    return _grad_fakes(q, k, v, learnable_sink)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, \
        deterministic = inputs[:11]
    wl, wr, softcap, sink, seqused_q = (tuple(inputs[11:16]) + (-1, -1, 0.0, None, None)[len(inputs[11:16]):])
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, sink, seqused_q, seqused_k)
    ctx.scalars = (max_seqlen_q, max_seqlen_k, causal, softmax_scale, deterministic, wl, wr, softcap)
    ctx.mark_non_differentiable(lse)  # as fwd's: fattn_bwd takes no dlse


def _varlen_backward(ctx, dout, dlse):
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, sink, seqused_q, seqused_k = ctx.saved_tensors
    want = _wants_dsink(ctx, 14, sink)
    dq, dk, dv, dsink = bwd_varlen(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, *ctx.scalars,
                                   sink if want else None, seqused_q, seqused_k)
    return (dq, dk, dv) + (None,) * 11 + (dsink if want else None, None)  # the last: seqused_q


fwd_varlen.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


def _max_seqlen(x, name):
    """max_seqlen_q/k as an int (a SymInt under torch.compile stays one); a tensor is refused:
    reading it would synchronise with the device."""
    if isinstance(x, (bool, torch.Tensor)) or not (isinstance(x, (int, torch.SymInt)) or hasattr(x, "__index__")):
        raise TypeError("fattn: %s must be an int (the longest sequence's length), got a %s"
                        % (name, type(x).__name__))
    return x if isinstance(x, (int, torch.SymInt)) else int(x.__index__())


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
           deterministic, window_size=None, softcap=0.0, learnable_sink=None, seqused_q=None):
    """fattn.flash_attn_varlen_func once its FA3 arguments are checked: (out, lse);
    window_size None or (left, right), softcap, learnable_sink: fattn.attention's."""
    _check_inputs(q, k, v)
    max_seqlen_q = _max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _max_seqlen(max_seqlen_k, "max_seqlen_k")
    shapes = _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
    scale = _core.resolve_scale(softmax_scale, shapes.dims.d)
    sink = _sink_tensor(learnable_sink, q)
    if seqused_q is not None:
        seqused_q = _int32_on(seqused_q, "seqused_q", q.device, (shapes.dims.b,))
    wl, wr = window_size if window_size is not None else (-1, -1)
    return fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, bool(causal),
                      scale, bool(deterministic), int(wl), int(wr), float(softcap), sink, seqused_q)


from . import _merge_torch  # noqa: E402, F401 - registers <ns>::merge with the other ops
from ._torch_kvcache import kvcache  # noqa: E402, F401 - flash_attn_with_kvcache's ops, registered here too
