"""_merge.py - fattn.merge: partial attention results over disjoint key sets, (O_i, LSE_i),
combined into the attention over all their keys by fattn_merge (fattn.h), on torch tensors
(the custom op <ns>::merge of _merge_torch.py, registered with the other ops) or NumPy arrays
(the CPU engine).  Neither NumPy nor torch is imported here."""
import collections
import ctypes

from . import _capi, _core

MAX_PARTS = 1024  # FATTN_MERGE_MAX_PARTS

# b, s, h, d: fattn_merge_args' batch, seqlen, heads, head_dim; packed: the parts are
# FlashAttention's variable-length [total, h, d] with LSE [h, total] (batch 1 to the C API).
MergeDims = collections.namedtuple("MergeDims", "n b s h d packed")


def split_parts(xs, name):
    """A stacked tensor or array [n_parts, ...] or a list/tuple of parts, as a list."""
    if isinstance(xs, (list, tuple)):
        return list(xs)
    if _core.is_numpy(xs) or hasattr(xs, "data_ptr"):
        if len(xs.shape) < 1:
            raise ValueError("fattn.merge: %s must be [n_parts, ...] or a list of parts, got shape %s"
                             % (name, tuple(xs.shape)))
        return [xs[i] for i in range(xs.shape[0])]
    raise TypeError("fattn.merge: %s must be a torch tensor, a NumPy array or a list of them, got a %s"
                    % (name, type(xs).__name__))


def check_shapes(out_shapes, lse_shapes):
    """MergeDims of the parts' shapes: each out [b, s, h, d] with lse [b, h, s], or each
    out [total, h, d] with lse [h, total] (a packed variable-length batch); ValueError
    naming the part that does not fit."""
    n = len(out_shapes)
    if n != len(lse_shapes):
        raise ValueError("fattn.merge: %d out parts but %d lse parts" % (n, len(lse_shapes)))
    if not 1 <= n <= MAX_PARTS:
        raise ValueError("fattn.merge: %d parts; fattn_merge takes 1..%d" % (n, MAX_PARTS))
    o0 = tuple(out_shapes[0])
    if len(o0) == 4:
        b, s, h, d = o0
        lse_shape, packed = (b, h, s), False
    elif len(o0) == 3:
        s, h, d = o0
        b, lse_shape, packed = 1, (h, s), True
    else:
        raise ValueError("fattn.merge: a part's out must be [batch, seqlen, heads, head_dim] or packed "
                         "[total, heads, head_dim], got shape %s" % (o0,))
    for i, (os_, ls) in enumerate(zip(out_shapes, lse_shapes)):
        if tuple(os_) != o0:
            raise ValueError("fattn.merge: out part %d has shape %s, part 0 %s" % (i, tuple(os_), o0))
        if tuple(ls) != lse_shape:
            raise ValueError("fattn.merge: lse part %d has shape %s; with out parts %s it must be %s "
                             "(FlashAttention's LSE layout)" % (i, tuple(ls), o0, lse_shape))
    for nm, x in (("batch", b), ("seqlen", s), ("heads", h), ("head_dim", d)):
        _capi.check_int("fattn.merge: " + nm, x)
    return MergeDims(n, b, s, h, d, packed)


def out_fattn_dtype(part_dtypes, out_dtype):
    """The fattn dtype of the merged out: out_dtype's (a fattn dtype), else the parts'
    common one, else float32 (parts of several dtypes)."""
    if out_dtype is not None:
        return out_dtype
    return part_dtypes[0] if len(set(part_dtypes)) == 1 else _core.F32


def as4(d, dims):
    """A Desc of a packed [total, h, d] part seen as [1, total, h, d] (fattn.h's varlen rule)."""
    if not dims.packed:
        return d
    shape = (1,) + tuple(d.shape)
    strides = (0,) + tuple(d.strides) if d.strides is not None else None  # batch 1: its stride is not read
    cs = _core.c_strides(shape, strides) if strides is not None else None
    return _core.Desc(d.name, d.ptr, d.dtype, shape, strides, cs, d.contiguous)


def run_merge(ctx, dims, part_descs, lse_ptrs, od, lse_ptr):
    """fattn_merge of described parts (Descs, [b, s, h, d] or packed) and their LSE pointers
    into od and lse_ptr, on ctx (its lock held by the caller where a stream matters)."""
    parts = (_capi.MergePart * dims.n)()
    for i, (pd, lp) in enumerate(zip(part_descs, lse_ptrs)):
        parts[i].o = _core.tensor_struct(as4(pd, dims))
        parts[i].lse = lp
    a = _capi.MergeArgs()
    a.batch, a.seqlen, a.heads, a.head_dim, a.num_parts = dims.b, dims.s, dims.h, dims.d, dims.n
    a.parts = ctypes.cast(parts, ctypes.c_void_p)
    a.o = _core.tensor_struct(as4(od, dims))
    a.lse = lse_ptr
    with ctx._lock:
        ctx._check(_core.lib.fattn_merge(ctx._handle(), ctypes.byref(a)), "fattn_merge")


def merge(outs, lses, out_dtype=None):
    """The attention over the union of disjoint key sets from the attention over each:
    per query row, with m = max_i lse_i and w_i = exp(lse_i - m),
        out = sum_i w_i out_i / sum_i w_i,   lse = m + log(sum_i w_i)   (fattn_merge).

    outs: the parts' outputs, a list of n_parts [b, s, h, d] tensors or arrays (or one
      stacked [n_parts, b, s, h, d]); float32, float16 or bfloat16, parts may differ in
      dtype; any strides (a head dim that is not contiguous is read through a copy).
      Packed variable-length outputs [total, h, d] work too (FlashAttention's varlen).
    lses: their LSEs, float32 [b, h, s] each (or stacked [n_parts, b, h, s]; [h, total]
      for packed parts): fattn.attention(..., return_lse=True)'s and FlashAttention's
      softmax_lse layout.
    out_dtype: the merged out's dtype (torch or NumPy dtype, or its name); None = the
      parts' dtype, float32 when they differ.
    A part whose lse is -inf for a row (no key of its set visible to the row, as a causal
    block above the diagonal) takes no part in that row and its out there is not read (it
    may be NaN); a row that is -inf in every part gets out 0 and lse -inf.  1 to 1024
    parts.  Returns (out [b, s, h, d] in out_dtype, lse [b, h, s] float32).

    Torch tensors (CUDA or CPU, all on one device): the custom op torch.ops.fattn.merge,
    traceable by torch.compile, on torch's current stream; forward only (inputs that
    require grad, with grad mode on, raise NotImplementedError).  NumPy arrays: the CPU
    engine (bfloat16 through ml_dtypes)."""
    outs, lses = split_parts(outs, "outs"), split_parts(lses, "lses")
    if not outs:
        raise ValueError("fattn.merge: no parts (fattn_merge takes 1..%d)" % MAX_PARTS)
    from . import _is_torch, _torch_module
    if _is_torch(outs[0]):
        return _torch_module()._merge_torch.merge(outs, lses, out_dtype)
    if _core.is_numpy(outs[0]):
        return _merge_numpy(outs, lses, out_dtype)
    raise TypeError("fattn.merge takes torch tensors or NumPy arrays, got a %s" % type(outs[0]).__name__)


def _numpy_dtype(np, out_dtype):
    if out_dtype is None:
        return None
    name = str(out_dtype).replace("torch.", "")
    try:
        name = np.dtype(out_dtype).name
    except TypeError:
        pass
    dt = _core._NUMPY_DTYPES.get(name)
    if dt is None:
        raise TypeError("fattn.merge: out_dtype must be float32, float16 or bfloat16, got %r" % (out_dtype,))
    return dt


def _merge_numpy(outs, lses, out_dtype):
    import numpy as np
    for i, (o, l) in enumerate(zip(outs, lses)):
        if not isinstance(o, np.ndarray) or not isinstance(l, np.ndarray):
            raise TypeError("fattn.merge: part %d is not a pair of NumPy arrays (got %s, %s)"
                            % (i, type(o).__name__, type(l).__name__))
        if l.dtype.newbyteorder("=") != np.float32:  # '>f4' is read through a native copy
            raise TypeError("fattn.merge: lse part %d has dtype %s; fattn_merge reads float32 LSEs" % (i, l.dtype))
    dims = check_shapes([o.shape for o in outs], [l.shape for l in lses])
    allow = (_core.F32, _core.F16, _core.BF16)
    outs = [o if o.dtype.isnative else o.astype(o.dtype.newbyteorder("=")) for o in outs]
    descs = []
    for i, o in enumerate(outs):
        d = _core.describe(o, "outs[%d]" % i, allow)
        if as4(d, dims).c_strides is None:
            o = outs[i] = np.ascontiguousarray(o)
            d = _core.describe(o, "outs[%d]" % i, allow)
        descs.append(d)
    lses = [np.ascontiguousarray(l, dtype=np.float32) for l in lses]
    odt = out_fattn_dtype([d.dtype for d in descs], _numpy_dtype(np, out_dtype))
    np_dt = {_core.F32: np.dtype(np.float32), _core.F16: np.dtype(np.float16)}.get(odt)
    if np_dt is None:  # bfloat16: ml_dtypes' dtype, the one the bf16 parts have or ml_dtypes'
        np_dt = next((o.dtype for o in outs if o.dtype.name == "bfloat16"), None)
        if np_dt is None:
            import ml_dtypes
            np_dt = np.dtype(ml_dtypes.bfloat16)
    out = np.empty(outs[0].shape, dtype=np_dt)
    lse = np.empty(lses[0].shape, dtype=np.float32)
    if out.size == 0 or lse.size == 0:  # no row, or head_dim 0: fattn_merge takes sizes >= 1
        out[...] = 0
        if lse.size:
            with np.errstate(invalid="ignore"):
                lse[...] = np.logaddexp.reduce(np.stack(lses), axis=0)
        return out, lse
    run_merge(_core.context(_core.BACKEND_CPU), dims, descs,
              [l.ctypes.data for l in lses], _core.describe(out, "out"), lse.ctypes.data)
    return out, lse
