"""_torch.py - fattn on torch tensors: the custom ops <ns>::fwd, <ns>::bwd,
<ns>::fwd_fp8, <ns>::fwd_kvcache, <ns>::fwd_varlen and <ns>::bwd_varlen
(torch.library, with fake implementations for torch.compile), autograd through
fattn_bwd (fwd_fp8 is forward only: its backward raises; fwd_kvcache, decoding,
has none; fwd_varlen's goes through bwd_varlen, but not with seqused_k).

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
              window_right=-1, softcap=0.0, sink=None):
    """(dq, dk, dv, dsink): dq, dk, dv shaped and typed like q, k, v, through fattn_bwd,
    and dsink float32 [hq] when a sink is given (_op_sink's; else an empty tensor);
    shapes: the call's _core.Dims, or its VarlenDims with varlen (a _core.Varlen): the
    packed 3-D tensors are then described as batch 1."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
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
                          dsink.data_ptr() if sink is not None else None)
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


def _bwd_fake(dout, q, k, v, *rest):
    """The fake of bwd and bwd_varlen: the gradients are shaped like q, k, v; dsink
    [hq] when the last argument, learnable_sink, is given, else [0]."""
    sink = rest[-1] if rest and isinstance(rest[-1], torch.Tensor) else None
    return tuple(t.new_empty(t.shape) for t in (q, k, v)) + (
        q.new_empty((q.shape[-2] if sink is not None else 0,), dtype=torch.float32),)


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


# ---------------------------------------------------------------------------
# Decoding on a KV cache: fattn_kv_append, then fattn_fwd with seqused_k and
# (paged) block_table; fattn.flash_attn_with_kvcache
# ---------------------------------------------------------------------------

def _cache_desc(t, name):
    """Desc of a cache, read (and written) where it is: never a copy."""
    d = _core.describe(t, name)
    if d.c_strides is None:
        raise ValueError("fattn: %s's layout %s with strides %s cannot be used in place: the head dim must be "
                         "contiguous and no dimension expanded" % (name, tuple(t.shape), tuple(t.stride())))
    return d


def _kv8_scale_block(scale, cache):
    """fattn_tensor's scale_block of an e4m3 cache's scales: [entries, hkv] one per
    page or sequence (the cache's rows), [entries, hkv, rows] one per token."""
    return 1 if scale.dim() == 3 else cache.shape[1]


def _kvcache_impl(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                  window_left=-1, window_right=-1, softcap=0.0, sink=None, k_scale=None, v_scale=None,
                  cache_batch_idx=None, cache_leftpad=None):
    kv = _core.check_kvcache_shapes(q.shape, k_cache.shape, v_cache.shape, None if k is None else k.shape,
                                    None if v is None else v.shape,
                                    None if page_table is None else page_table.shape,
                                    cache_batch=cache_batch_idx is not None)
    dims = kv.dims
    append = k is not None and dims.b > 0 and kv.seqlen_new > 0 and dims.hkv > 0
    if k is not None and cache_seqlens is None:
        raise ValueError("fattn: k and v (rows to append) need cache_seqlens (where each sequence's rows go)")
    if not append and dims.empty:
        return _new_outputs(dims, q, None, sink)
    out = torch.empty(dims.o_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(dims.lse_shape, dtype=torch.float32, device=q.device)
    for name, t, shape in (("cache_seqlens", cache_seqlens, (dims.b,)),
                           ("page_table", page_table, (dims.b, kv.max_pages))):
        if t is not None and (t.dtype != torch.int32 or t.device != q.device or tuple(t.shape) != shape
                              or not t.is_contiguous()):
            raise ValueError("fattn: %s must be a contiguous int32 tensor %s on %s, got %s %s on %s"
                             % (name, shape, q.device, t.dtype, tuple(t.shape), t.device))
    ctx = _context(q.device)
    q, qd = _readable(q, "q")
    kcd, vcd = _cache_desc(k_cache, "k_cache"), _cache_desc(v_cache, "v_cache")
    scales = None  # an e4m3 cache: (k scale pointer, block, v scale pointer, block)
    if k_scale is not None:
        scales = (k_scale.data_ptr(), _kv8_scale_block(k_scale, k_cache), v_scale.data_ptr(),
                  _kv8_scale_block(v_scale, v_cache))
    seqlens_ptr = cache_seqlens.data_ptr() if cache_seqlens is not None else None
    table_ptr = page_table.data_ptr() if page_table is not None else None
    seqused = cache_seqlens
    if append and cache_batch_idx is not None:
        # fattn_kv_append has no cache_batch_idx: the rows go into entries cache_batch_idx[b] by indexing
        seqused = cache_seqlens + kv.seqlen_new
        _append_at_entries(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx)
        append = False
    if append:
        k, knd = _readable(k, "k")
        v, vnd = _readable(v, "v")
        seqused = cache_seqlens + kv.seqlen_new  # on the device, no host synchronisation
    od = _core.describe(out, "out")
    with ctx._lock:
        _on_current_stream(ctx, q.device)
        if append:
            ctx.kv_append_raw(_core.kv_append_struct(kv, knd, vnd, kcd, vcd, seqlens_ptr, table_ptr, scales))
        if dims.empty:
            return _new_outputs(dims, q, None, sink)
        a = _core.fwd_kvcache_struct(kv, qd, kcd, vcd, od, lse.data_ptr(), causal, softmax_scale,
                                     seqused.data_ptr() if seqused is not None else None, table_ptr,
                                     _variants(window_left, window_right, softcap, sink), scales,
                                     cache_batch_idx.data_ptr() if cache_batch_idx is not None else None,
                                     k_cache.shape[0],
                                     cache_leftpad.data_ptr() if cache_leftpad is not None else None)
        try:
            with ctx.option_set(_core.OPTION_DISABLE_SPLIT, int(bool(disable_split))):
                ctx.fwd_raw(a)
        except _core.FattnUnsupportedError:
            # more query rows than the CUDA decoding kernel takes: the same call as varlen queries on the
            # cache (cu_seqlens_q alone: the varlen kernels' KV-cache instances), whose LSE is [hq, b * sq]
            if not (q.is_cuda and scales is None and q.is_contiguous() and out.is_contiguous() and dims.sq > 0):
                raise
            lse_v = torch.empty((dims.hq, dims.b * dims.sq), dtype=torch.float32, device=q.device)
            cu_q = torch.arange(0, (dims.b + 1) * dims.sq, dims.sq, dtype=torch.int32, device=q.device)
            a.p.cu_seqlens_q = cu_q.data_ptr()
            a.p.total_q = dims.b * dims.sq
            a.lse = lse_v.data_ptr()
            ctx.fwd_raw(a)
            lse.copy_(lse_v.view(dims.hq, dims.b, dims.sq).permute(1, 0, 2))
    return out, lse


def _append_at_entries(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx):
    """k, v [b, s_new, hkv, d] into rows cache_seqlens[b] .. + s_new - 1 of entries cache_batch_idx[b] of
    contiguous caches (the bytes fattn_kv_append would copy).  Rows past the capacity: ValueError on the
    CPU (as fattn_kv_append's check), left out on CUDA (as its kernel does)."""
    cap, s_new = k_cache.shape[1], k.shape[1]
    pos = cache_seqlens.long()[:, None] + torch.arange(s_new, device=k.device)
    ent = cache_batch_idx.long()[:, None].expand(-1, s_new)
    if k.device.type == "cpu":
        if bool((pos >= cap).any()) or bool((ent < 0).any()) or bool((ent >= k_cache.shape[0]).any()):
            raise ValueError("fattn: cache_seqlens + seqlen_new past the cache's capacity %d, or cache_batch_idx "
                             "outside [0, %d)" % (cap, k_cache.shape[0]))
        k_cache[ent, pos] = k
        v_cache[ent, pos] = v
        return
    ok = (pos < cap) & (ent >= 0) & (ent < k_cache.shape[0])
    k_cache[ent[ok], pos[ok]] = k[ok]
    v_cache[ent[ok], pos[ok]] = v[ok]


@torch.library.custom_op(_NS + "::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor], page_table: Optional[torch.Tensor],
                causal: bool, softmax_scale: float, disable_split: bool, window_left: int = -1,
                window_right: int = -1, softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                cache_batch_idx: Optional[torch.Tensor] = None,
                cache_leftpad: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decoding on a KV cache: k, v (or None) appended in place into k_cache, v_cache at the rows
    cache_seqlens (int32 [b]) says (fattn_kv_append), then attention of q over each sequence's first
    cache_seqlens (+ k's seqlen when appending) keys (fattn_fwd with seqused_k; cache_seqlens None = all
    keys).  page_table int32 [b, max_pages] (contiguous): the caches are page pools [num_pages, page_size,
    hkv, d].  disable_split: FATTN_OPTION_DISABLE_SPLIT for the call.  The variants as fwd's.
    cache_batch_idx (int32 [b]: sequence b's entry of a contiguous cache) and cache_leftpad (int32 [b]: its
    keys from that row on): FA3's (fattn.h).
    (out [b, sq, hq, dv], lse [b, hq, sq] float32, the sink included).  No autograd."""
    return _kvcache_impl(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                         window_left, window_right, softcap, _op_sink(learnable_sink, q),
                         cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                      *variants):
    b, sq, hq, _ = q.shape
    return (q.new_empty((b, sq, hq, v_cache.shape[3])), q.new_empty((b, hq, sq), dtype=torch.float32))


# An op of its own for an FP8 cache: its scales are written (mutated) too, and a
# mutated argument must not be Optional (torch's in-place bookkeeping indexes it).
@torch.library.custom_op(_NS + "::fwd_kvcache_fp8", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))
def fwd_kvcache_fp8(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                    v_scale: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                    cache_seqlens: Optional[torch.Tensor], page_table: Optional[torch.Tensor], causal: bool,
                    softmax_scale: float, disable_split: bool, window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                    cache_leftpad: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """fwd_kvcache on an FP8 KV cache: float8_e4m3fn k_cache, v_cache with their float32 scales
    k_scale, v_scale (kvcache's checks), which an append writes as it quantises k, v."""
    return _kvcache_impl(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                         window_left, window_right, softcap, _op_sink(learnable_sink, q), k_scale, v_scale,
                         cache_leftpad=cache_leftpad)


@fwd_kvcache_fp8.register_fake
def _fwd_kvcache_fp8_fake(q, k_cache, v_cache, k_scale, v_scale, *rest):
    b, sq, hq, _ = q.shape
    return (q.new_empty((b, sq, hq, v_cache.shape[3])), q.new_empty((b, hq, sq), dtype=torch.float32))


@torch.library.custom_op(_NS + "::fwd_kvcache_varlen", mutates_args=())
def fwd_kvcache_varlen(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                       cache_seqlens: Optional[torch.Tensor], page_table: Optional[torch.Tensor], max_seqlen_q: int,
                       causal: bool, softmax_scale: float, window_left: int = -1, window_right: int = -1,
                       softcap: float = 0.0,
                       learnable_sink: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen queries on a KV cache (chunked prefill; fattn_fwd with cu_seqlens_q alone): q [total_q, hq,
    d] packed by cu_seqlens_q (int32 [b + 1]), sequence b attending its first cache_seqlens[b] keys of the
    cache (None: all), causal bottom-right aligned on them.  (out [total_q, hq, dv], lse [hq, total_q]
    float32, the sink included).  No append, no autograd."""
    b, total_q = cu_seqlens_q.shape[0] - 1, q.shape[0]
    kv = _core.check_kvcache_shapes((b, max_seqlen_q) + tuple(q.shape[1:]), k_cache.shape, v_cache.shape, None,
                                    None, None if page_table is None else page_table.shape)
    sink = _op_sink(learnable_sink, q)
    out = torch.empty((total_q, kv.dims.hq, kv.dims.dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((kv.dims.hq, total_q), dtype=torch.float32, device=q.device)
    if total_q == 0 or b == 0 or kv.dims.hq == 0:
        return out, lse
    ctx = _context(q.device)
    q, qd = _readable(q.unsqueeze(0), "q")
    kcd, vcd = _cache_desc(k_cache, "k_cache"), _cache_desc(v_cache, "v_cache")
    od = _core.describe(out.unsqueeze(0), "out")
    a = _core.fwd_kvcache_struct(kv, qd, kcd, vcd, od, lse.data_ptr(), causal, softmax_scale,
                                 cache_seqlens.data_ptr() if cache_seqlens is not None else None,
                                 page_table.data_ptr() if page_table is not None else None,
                                 _variants(window_left, window_right, softcap, sink))
    a.p.cu_seqlens_q = cu_seqlens_q.data_ptr()
    a.p.total_q = total_q
    with ctx._lock:
        _on_current_stream(ctx, q.device)
        ctx.fwd_raw(a)
    return out, lse


@fwd_kvcache_varlen.register_fake
def _fwd_kvcache_varlen_fake(q, k_cache, v_cache, *rest):
    return (q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


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


def _check_kv8(q, k_cache, v_cache, k_scale, v_scale):
    """An FP8 KV cache's tensors (flash_attn_with_kvcache's docstring): True for
    an e4m3 cache with its scales, False for a 16-bit one without; TypeError /
    ValueError naming the tensor otherwise."""
    e4m3 = [isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in (k_cache, v_cache)]
    if not any(e4m3):
        if k_scale is not None or v_scale is not None:
            raise ValueError("fattn: k_scale and v_scale go with a float8_e4m3fn k_cache and v_cache (an FP8 KV "
                             "cache); the caches are %s" % (k_cache.dtype,))
        return False
    if not all(e4m3):
        raise TypeError("fattn: k_cache and v_cache must both be float8_e4m3fn (an FP8 KV cache), got %s and %s"
                        % (k_cache.dtype, v_cache.dtype))
    if not isinstance(q, torch.Tensor) or q.dtype not in _DTYPES:
        raise TypeError("fattn: an FP8 KV cache takes float16, bfloat16 or float32 q, got %s"
                        % (getattr(q, "dtype", type(q).__name__),))
    if not (q.device == k_cache.device == v_cache.device):
        raise ValueError("fattn: q, k_cache and v_cache must be on one device, got %s, %s and %s"
                         % (q.device, k_cache.device, v_cache.device))
    for name, sc, cache in (("k_scale", k_scale, k_cache), ("v_scale", v_scale, v_cache)):
        if sc is None:
            raise ValueError("fattn: a float8_e4m3fn cache needs %s (float32 [num_pages, hkv] per page or "
                             "[num_pages, hkv, page_size] per token)" % name)
        want2, want3 = (cache.shape[0], cache.shape[2]), (cache.shape[0], cache.shape[2], cache.shape[1])
        if not isinstance(sc, torch.Tensor) or sc.dtype != torch.float32 or not sc.is_contiguous() \
                or sc.device != q.device or tuple(sc.shape) not in (want2, want3):
            raise ValueError("fattn: %s must be a contiguous float32 tensor on %s of shape %s (one scale per page "
                             "or sequence and kv head) or %s (per token and kv head), got %s"
                             % (name, q.device, want2, want3,
                                "%s %s on %s" % (sc.dtype, tuple(sc.shape), sc.device)
                                if isinstance(sc, torch.Tensor) else type(sc).__name__))
    return True


def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale, causal, disable_split,
            window_size=None, softcap=0.0, learnable_sink=None, k_scale=None, v_scale=None, cu_seqlens_q=None,
            max_seqlen_q=None, cache_batch_idx=None, cache_leftpad=None):
    """fattn.flash_attn_with_kvcache once its FA3 arguments are checked: (out, lse);
    window_size None or (left, right), softcap, learnable_sink: fattn.attention's;
    k_scale, v_scale: an FP8 KV cache's scales (_check_kv8); cu_seqlens_q with
    max_seqlen_q: q packed [total_q, hq, d] (no append), out [total_q, hq, dv],
    lse [hq, total_q]."""
    if _check_kv8(q, k_cache, v_cache, k_scale, v_scale):
        _check_inputs(q, q, q)
    else:
        _check_inputs(q, k_cache, v_cache)
    if (k is None) != (v is None):
        raise ValueError("fattn: k and v (the rows to append) must be given together")
    if k is not None:
        _check_inputs(q, k, v)
    grads = [n for n, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                            ("learnable_sink", learnable_sink), ("k_scale", k_scale), ("v_scale", v_scale))
             if isinstance(t, torch.Tensor) and t.requires_grad]
    if grads and torch.is_grad_enabled():
        raise NotImplementedError("fattn.flash_attn_with_kvcache is forward only (decoding; FlashAttention's has no "
                                  "backward either), but %s require%s grad: call it under torch.no_grad() or "
                                  "torch.inference_mode(), or on detached tensors"
                                  % (", ".join(grads), "s" if len(grads) == 1 else ""))
    if cu_seqlens_q is not None:
        if cache_batch_idx is not None or cache_leftpad is not None:
            raise NotImplementedError("fattn.flash_attn_with_kvcache: cache_batch_idx or cache_leftpad with "
                                      "cu_seqlens_q is not supported by fattn's Python layer yet (fattn_fwd takes "
                                      "them)")
        return _kvcache_varlen(q, k_cache, v_cache, k, cache_seqlens, page_table, softmax_scale, causal, window_size,
                               softcap, learnable_sink, k_scale, cu_seqlens_q, max_seqlen_q)
    if q.dim() != 4:
        raise ValueError("fattn: q must be 4-D [batch, seqlen, heads, head_dim], got shape %s" % (tuple(q.shape),))
    sink = _sink_tensor(learnable_sink, q)
    b = q.shape[0]
    if cache_batch_idx is not None:
        cache_batch_idx = _int32_on(cache_batch_idx, "cache_batch_idx", q.device, (b,))
        if page_table is not None:  # FA3: the index picks each sequence's row of the page table
            page_table = page_table[cache_batch_idx.long()].contiguous()
            cache_batch_idx = None
        elif k_scale is not None:
            raise NotImplementedError("fattn.flash_attn_with_kvcache: cache_batch_idx on a contiguous FP8 KV cache "
                                      "is not supported by fattn")
    if page_table is not None:
        if isinstance(page_table, torch.Tensor) and page_table.dim() != 2:
            raise ValueError("fattn: page_table must be [batch, max_pages_per_seq], got shape %s"
                             % (tuple(page_table.shape),))
        page_table = _int32_on(page_table, "page_table", q.device,
                               (b, page_table.shape[1]) if isinstance(page_table, torch.Tensor) else None)
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, torch.Tensor):
            cache_seqlens = _int32_on(cache_seqlens, "cache_seqlens", q.device, (b,))
        else:
            if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
                raise TypeError("fattn: cache_seqlens must be an int or an int32 tensor [batch], got a %s"
                                % type(cache_seqlens).__name__)
            if not 0 <= cache_seqlens <= 2 ** 31 - 1:
                raise ValueError("fattn: cache_seqlens must be in [0, 2**31), got %d" % cache_seqlens)
            cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    if k is not None and cache_seqlens is None:
        raise ValueError("fattn: k and v (rows to append) need cache_seqlens (where each sequence's rows go), as "
                         "FlashAttention's")
    if cache_leftpad is not None:
        cache_leftpad = _int32_on(cache_leftpad, "cache_leftpad", q.device, (b,))
    kv = _core.check_kvcache_shapes(q.shape, k_cache.shape, v_cache.shape, None if k is None else k.shape,
                                    None if v is None else v.shape,
                                    None if page_table is None else page_table.shape,
                                    cache_batch=cache_batch_idx is not None)
    if kv.seqlen_new and kv.dims.dv != kv.dims.d:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: appending k, v with head_dim_v %d != head_dim %d "
                                  "is not supported by fattn (fattn_kv_append copies rows of one head_dim)"
                                  % (kv.dims.dv, kv.dims.d))
    scale = _core.resolve_scale(softmax_scale, kv.dims.d)
    wl, wr = window_size if window_size is not None else (-1, -1)
    if k_scale is not None:
        return fwd_kvcache_fp8(q, k_cache, v_cache, k_scale, v_scale, k, v, cache_seqlens, page_table, bool(causal),
                               scale, bool(disable_split), int(wl), int(wr), float(softcap), sink, cache_leftpad)
    return fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table, bool(causal), scale,
                       bool(disable_split), int(wl), int(wr), float(softcap), sink, cache_batch_idx, cache_leftpad)


def _kvcache_varlen(q, k_cache, v_cache, k, cache_seqlens, page_table, softmax_scale, causal, window_size, softcap,
                    learnable_sink, k_scale, cu_seqlens_q, max_seqlen_q):
    """kvcache with cu_seqlens_q: varlen queries on the cache (fwd_kvcache_varlen)."""
    if k is not None:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: k, v to append with cu_seqlens_q (a varlen batch "
                                  "of new rows, FA3's cu_seqlens_k_new) are not supported by fattn: append with "
                                  "fattn's kv_append first, then attend")
    if k_scale is not None:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: cu_seqlens_q on an FP8 KV cache is not supported "
                                  "by fattn yet (its kernels serve the decoding shapes only)")
    if q.dim() != 3:
        raise ValueError("fattn: with cu_seqlens_q, q must be packed [total_q, heads, head_dim], got shape %s"
                         % (tuple(q.shape),))
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
        raise ValueError("fattn: cu_seqlens_q must be an int32 tensor [batch + 1]")
    b = cu_seqlens_q.shape[0] - 1
    cu = _int32_on(cu_seqlens_q, "cu_seqlens_q", q.device, (b + 1,))
    if max_seqlen_q is None or isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise ValueError("fattn: cu_seqlens_q needs max_seqlen_q, an int >= every sequence's query count (the "
                         "lengths are not read on the host), got %r" % (max_seqlen_q,))
    sink = _sink_tensor(learnable_sink, q)
    if page_table is not None:
        page_table = _int32_on(page_table, "page_table", q.device,
                               (b, page_table.shape[1]) if isinstance(page_table, torch.Tensor) else None)
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, torch.Tensor):
            cache_seqlens = _int32_on(cache_seqlens, "cache_seqlens", q.device, (b,))
        else:
            cache_seqlens = torch.full((b,), int(cache_seqlens), dtype=torch.int32, device=q.device)
    scale = _core.resolve_scale(softmax_scale, q.shape[2])
    wl, wr = window_size if window_size is not None else (-1, -1)
    return fwd_kvcache_varlen(q, k_cache, v_cache, cu, cache_seqlens, page_table, int(max_seqlen_q), bool(causal),
                              scale, int(wl), int(wr), float(softcap), sink)


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
    [hq, total_q] float32, the sink included).  `deterministic` is kept for the backward (none with
    seqused_k).  The variants as fwd's, per sequence (its own lengths).  seqused_q (int32 [batch] or
    None): sequence b computes its first seqused_q[b] queries only, the other rows of out and lse left
    unwritten (FA3's: they promise nothing there); forward only, as seqused_k."""
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
               window_right: int = -1, softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink) of fwd_varlen (without seqused_k), as bwd's, through fattn_bwd with the
    same cu_seqlens (dsink sums the rows of every sequence)."""
    shapes = _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, None, max_seqlen_q, max_seqlen_k)
    return _bwd_impl(shapes, dout, q, k, v, out, lse, causal, softmax_scale, deterministic,
                     _varlen_fields(shapes, cu_seqlens_q, cu_seqlens_k), window_left, window_right, softcap,
                     _op_sink(learnable_sink, q))


bwd_varlen.register_fake(_bwd_fake)


def _seqused_grad_error():
    return NotImplementedError("fattn: the backward of a variable-length call with seqused_k or seqused_q is not "
                               "supported here: call it under torch.no_grad() or on tensors that do not require "
                               "grad, or leave them unset")


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, \
        deterministic = inputs[:11]
    wl, wr, softcap, sink = (tuple(inputs[11:15]) + (-1, -1, 0.0, None)[len(inputs[11:15]):])
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, sink)
    ctx.seqused = seqused_k is not None or (len(inputs) > 15 and inputs[15] is not None)
    ctx.scalars = (max_seqlen_q, max_seqlen_k, causal, softmax_scale, deterministic, wl, wr, softcap)
    ctx.mark_non_differentiable(lse)  # as fwd's: fattn_bwd takes no dlse


def _varlen_backward(ctx, dout, dlse):
    if ctx.seqused:  # varlen() refuses this before the call; a direct op call raises here
        raise _seqused_grad_error()
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, sink = ctx.saved_tensors
    want = _wants_dsink(ctx, 14, sink)
    dq, dk, dv, dsink = bwd_varlen(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, *ctx.scalars,
                                   sink if want else None)
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
    if (seqused_k is not None or seqused_q is not None) and _requires_grad(q, k, v, sink):
        raise _seqused_grad_error()
    if seqused_q is not None:
        seqused_q = _int32_on(seqused_q, "seqused_q", q.device, (shapes.dims.b,))
    wl, wr = window_size if window_size is not None else (-1, -1)
    return fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, bool(causal),
                      scale, bool(deterministic), int(wl), int(wr), float(softcap), sink, seqused_q)


from . import _merge_torch  # noqa: E402, F401 - registers <ns>::merge with the other ops
