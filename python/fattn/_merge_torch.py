"""_merge_torch.py - the custom op <ns>::merge (fattn_merge on torch tensors, CUDA or CPU)
with its fake implementation for torch.compile; imported by _torch.py, so that the op is
registered with the others as soon as torch is."""
from typing import List, Tuple

import torch

from . import _core, _merge, _torch

_NS = _torch._NS
_FATTN_DTYPES = {torch.float32: _core.F32, torch.float16: _core.F16, torch.bfloat16: _core.BF16}


def _shapes(outs, lses):
    return _merge.check_shapes([o.shape for o in outs], [l.shape for l in lses])


@torch.library.custom_op(_NS + "::merge", mutates_args=())
def merge_op(outs: List[torch.Tensor], lses: List[torch.Tensor], out_dtype: torch.dtype
             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """fattn_merge of parts outs[i] [b, s, h, d] (or packed [total, h, d]) with float32
    lses[i] [b, h, s] ([h, total]), all on one device: (out in out_dtype, lse float32)."""
    dims = _shapes(outs, lses)
    dev = outs[0].device
    out = torch.empty(outs[0].shape, dtype=out_dtype, device=dev)
    lse = torch.empty(lses[0].shape, dtype=torch.float32, device=dev)
    if out.numel() == 0 or lse.numel() == 0:  # no row, or head_dim 0: fattn_merge takes sizes >= 1
        out.zero_()
        if lse.numel():
            lse.copy_(torch.logsumexp(torch.stack(list(lses)), 0))
        return out, lse
    descs, keep = [], []
    for i, o in enumerate(outs):
        d = _core.describe(o, "outs[%d]" % i, tuple(_FATTN_DTYPES.values()))
        if _merge.as4(d, dims).c_strides is None:  # a layout fattn cannot read as it is: a packed copy
            o = o.contiguous()
            d = _core.describe(o, "outs[%d]" % i)
        descs.append(d)
        keep.append(o)
    lses = [l.contiguous() for l in lses]
    ctx = _torch._context(dev)
    with ctx._lock:
        _torch._on_current_stream(ctx, dev)
        _merge.run_merge(ctx, dims, descs, [l.data_ptr() for l in lses], _core.describe(out, "out"), lse.data_ptr())
    return out, lse


@merge_op.register_fake
def _merge_fake(outs, lses, out_dtype):
    _shapes(outs, lses)
    return outs[0].new_empty(outs[0].shape, dtype=out_dtype), lses[0].new_empty(lses[0].shape, dtype=torch.float32)


def _torch_dtype(out_dtype):
    if out_dtype is None or isinstance(out_dtype, torch.dtype):
        dt = out_dtype
    else:
        dt = getattr(torch, str(out_dtype).replace("torch.", ""), None)
        try:
            import numpy as np
            dt = getattr(torch, np.dtype(out_dtype).name, dt)
        except (ImportError, TypeError):
            pass
    if dt is not None and dt not in _FATTN_DTYPES:
        raise TypeError("fattn.merge: out_dtype must be float32, float16 or bfloat16, got %r" % (out_dtype,))
    return dt


def merge(outs, lses, out_dtype=None):
    """fattn.merge on lists of torch tensors (checked here, then the op)."""
    dev = outs[0].device
    for i, (o, l) in enumerate(zip(outs, lses)):
        if not isinstance(o, torch.Tensor) or not isinstance(l, torch.Tensor):
            raise TypeError("fattn.merge: part %d is not a pair of torch tensors (got %s, %s)"
                            % (i, type(o).__name__, type(l).__name__))
        if o.device != dev or l.device != dev:
            raise ValueError("fattn.merge: part %d is on %s and %s, part 0's out on %s: all parts must be on one "
                             "device" % (i, o.device, l.device, dev))
        if o.dtype not in _FATTN_DTYPES:
            raise TypeError("fattn.merge: out part %d has dtype %s; fattn_merge takes float32, float16 and "
                            "bfloat16" % (i, o.dtype))
        if l.dtype != torch.float32:
            raise TypeError("fattn.merge: lse part %d has dtype %s; fattn_merge reads float32 LSEs" % (i, l.dtype))
    _shapes(outs, lses)
    if torch.is_grad_enabled() and any(t.requires_grad for t in list(outs) + list(lses)):
        raise NotImplementedError("fattn.merge is forward only (no backward): call it under torch.no_grad() or on "
                                  "tensors that do not require grad (the parts' LSEs from fattn's forward carry no gradient, "
                                  "so the gradient through merged blocks would be wrong)")
    dt = _torch_dtype(out_dtype)
    if dt is None:
        dt = outs[0].dtype if len({o.dtype for o in outs}) == 1 else torch.float32
    return merge_op(list(outs), list(lses), dt)
