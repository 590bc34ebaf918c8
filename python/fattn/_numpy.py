"""_numpy.py - fattn.attention on NumPy arrays (CPU engine, forward only: no autograd)."""
import numpy as np

from . import _core


def _readable(x, name):
    d = _core.describe(x, name)
    if d.c_strides is None:  # a layout fattn cannot read as it is: read a packed copy
        x = np.ascontiguousarray(x)
        d = _core.describe(x, name)
    return x, d


def _native(x):
    """x in the machine's byte order: arrays such as '>f4' are read through a
    converted copy (the library reads native words)."""
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


def _sink(learnable_sink, hq):
    """learnable_sink as a float32 [hq] array the library can read (a copy when needed)."""
    if learnable_sink is None:
        return None
    if not isinstance(learnable_sink, np.ndarray):
        raise TypeError("fattn: learnable_sink must be a NumPy array with q, got a %s" % type(learnable_sink).__name__)
    if learnable_sink.shape != (hq,) or learnable_sink.dtype.kind != "f":
        raise ValueError("fattn: learnable_sink must be a float array of shape (%d,) (one logit per query head), "
                         "got %s %s" % (hq, learnable_sink.dtype, learnable_sink.shape))
    return np.ascontiguousarray(learnable_sink, dtype=np.float32)


def attention(q, k, v, causal, softmax_scale, fp8, return_lse, out, ctx, window_size=None, softcap=0.0,
              learnable_sink=None):
    for n, x in (("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise TypeError("fattn: q is a NumPy array but %s is a %s" % (n, type(x).__name__))
    q, k, v = _native(q), _native(k), _native(v)
    if out is not None and isinstance(out, np.ndarray) and not out.dtype.isnative:
        raise ValueError("fattn: out has dtype %s in non-native byte order; fattn writes native words "
                         "(pass an array of dtype %s)" % (out.dtype.str, out.dtype.newbyteorder("=").str))
    dims = _core.check_shapes(q.shape, k.shape, v.shape)
    allow = (_core.F32, _core.F16, _core.BF16)
    qd, kd, vd = (_core.describe(x, n, allow) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    if not (qd.dtype == kd.dtype == vd.dtype):
        raise TypeError("fattn: q, k and v must have one dtype, got %s, %s and %s" % (q.dtype, k.dtype, v.dtype))
    scale = _core.resolve_scale(softmax_scale, dims.d)
    fp8 = _core.fp8_config(fp8)
    if ctx is None:
        ctx = _core.context(_core.BACKEND_CPU)
    elif ctx.backend != _core.BACKEND_CPU:
        raise ValueError("fattn: NumPy arrays are host memory and need a CPU context")

    if out is None:
        out = np.empty(dims.o_shape, dtype=q.dtype)
    else:
        od = _core.describe(out, "out", allow)
        if not isinstance(out, np.ndarray) or out.dtype != q.dtype or tuple(out.shape) != dims.o_shape:
            raise ValueError("fattn: out must be a %s array of shape %s, got %s %s"
                             % (q.dtype, dims.o_shape, out.dtype, tuple(out.shape)))
        if od.c_strides is None or not _core.non_overlapping(od.shape, od.strides) or not out.flags.writeable:
            raise ValueError("fattn: out must be writeable, non-overlapping, with its head dim contiguous")
    lse = np.empty(dims.lse_shape, dtype=np.float32) if return_lse else None

    sink = _sink(learnable_sink, dims.hq)
    if dims.empty:
        out[...] = 0
        if lse is not None:  # a row that sees no key: lse = the sink (fattn.h), -inf without one
            lse[...] = -np.inf if sink is None else sink[None, :, None]
    else:
        q, qd = _readable(q, "q")
        k, kd = _readable(k, "k")
        v, vd = _readable(v, "v")
        od = _core.describe(out, "out")
        lp = lse.ctypes.data if lse is not None else None
        var = _core.Variants(window_size, softcap, sink.ctypes.data if sink is not None else None)
        if fp8 is not None:
            _core.run_fwd_fp8(ctx, dims, qd, kd, vd, od, lp, causal, scale, fp8, var)
        else:
            _core.run_fwd(ctx, dims, qd, kd, vd, od, lp, causal, scale, variants=var)
    return (out, lse) if return_lse else out
