"""fattn: Python bindings (ctypes) over the fattn C library.

    import torch, fattn
    o = fattn.attention(q, k, v, causal=True)       # q [b, s, h, d] on a Hopper GPU

Tensors are torch tensors in [batch, seqlen, heads, head_dim] layout (any
strides with head_dim contiguous).  The library is found through the
FATTN_LIBRARY environment variable, else build/libfattn.so next to the source
tree, else the system's libfattn.so.
"""
import ctypes
import os

_here = os.path.dirname(os.path.abspath(__file__))

F32, F16, BF16, E4M3 = 0, 1, 2, 3
OPTION_DISABLE_OVERLAP, OPTION_DISABLE_PINGPONG, OPTION_DISABLE_PDL, OPTION_SOFTMAX_UNDER_PV = 0, 1, 2, 3
OPTION_DISABLE_SPLIT = 4
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("stride_batch", ctypes.c_int64),
                ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64),
                ("scale", ctypes.c_void_p), ("scale_block", ctypes.c_int32)]


class _Problem(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int32), ("seqlen_q", ctypes.c_int32), ("seqlen_k", ctypes.c_int32),
                ("heads_q", ctypes.c_int32), ("heads_kv", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("head_dim_v", ctypes.c_int32), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32),
                ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p)]


class _FwdArgs(ctypes.Structure):
    _fields_ = [("p", _Problem), ("q", _Tensor), ("k", _Tensor), ("v", _Tensor), ("o", _Tensor),
                ("lse", ctypes.c_void_p)]


def _load():
    cands = [os.environ.get("FATTN_LIBRARY"),
             os.path.join(_here, "..", "..", "build", "libfattn.so"), "libfattn.so"]
    err = None
    for c in cands:
        if not c:
            continue
        try:
            return ctypes.CDLL(c)
        except OSError as e:
            err = e
    raise OSError("cannot load libfattn.so (set FATTN_LIBRARY): %s" % err)


_lib = _load()
_lib.fattn_ctx_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
_lib.fattn_ctx_free.argtypes = [ctypes.c_void_p]
_lib.fattn_ctx_set_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_lib.fattn_ctx_set_option.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
_lib.fattn_last_error.argtypes = [ctypes.c_void_p]
_lib.fattn_last_error.restype = ctypes.c_char_p
_lib.fattn_status_string.restype = ctypes.c_char_p
_lib.fattn_fwd.argtypes = [ctypes.c_void_p, ctypes.POINTER(_FwdArgs)]
_lib.fattn_version_string.restype = ctypes.c_char_p

__version__ = _lib.fattn_version_string().decode()


class FattnError(RuntimeError):
    def __init__(self, status, msg):
        super().__init__("%s: %s" % (_lib.fattn_status_string(status).decode(), msg))
        self.status = status


class Context:
    """A fattn context on one CUDA device (or the CPU for backend=BACKEND_CPU)."""

    def __init__(self, backend=BACKEND_CUDA, device=0):
        self._h = ctypes.c_void_p()
        st = _lib.fattn_ctx_create(ctypes.byref(self._h), backend, device)
        if st != 0:
            raise FattnError(st, _lib.fattn_last_error(None).decode())
        self._stream = None

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.fattn_ctx_free(self._h)
            self._h = None

    def _check(self, st):
        if st != 0:
            raise FattnError(st, _lib.fattn_last_error(self._h).decode())

    def set_option(self, option, value):
        self._check(_lib.fattn_ctx_set_option(self._h, option, int(value)))

    def set_stream(self, stream_ptr):
        if stream_ptr != self._stream:
            self._check(_lib.fattn_ctx_set_stream(self._h, ctypes.c_void_p(stream_ptr)))
            self._stream = stream_ptr

    def fwd_args(self, q, k, v, out, lse=None, causal=False, softmax_scale=0.0):
        """Build the argument struct once (for timing loops); run with fwd_raw."""
        import torch
        dt = {torch.bfloat16: BF16, torch.float16: F16, torch.float32: F32}[q.dtype]

        def ten(t):
            assert t.dim() == 4 and t.stride(3) == 1, "tensors are [b, s, h, d] with d contiguous"
            return _Tensor(t.data_ptr(), dt, t.stride(0), t.stride(1), t.stride(2), None, 0)

        a = _FwdArgs()
        a.p = _Problem(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3],
                       float(softmax_scale), int(bool(causal)), None, None)
        a.q, a.k, a.v, a.o = ten(q), ten(k), ten(v), ten(out)
        a.lse = lse.data_ptr() if lse is not None else None
        return a

    def fwd_raw(self, args):
        self._check(_lib.fattn_fwd(self._h, ctypes.byref(args)))


_default_ctx = None


def attention(q, k, v, causal=False, softmax_scale=0.0, return_lse=False, out=None, ctx=None):
    """softmax(q k^T * scale) v for torch tensors [b, s, h, d] on a Hopper GPU
    (or on the CPU with a CPU context).  Returns o (and lse [b, h, s_q] fp32)."""
    import torch
    global _default_ctx
    if ctx is None:
        if _default_ctx is None:
            _default_ctx = Context(BACKEND_CUDA if q.is_cuda else BACKEND_CPU, q.device.index or 0)
        ctx = _default_ctx
    if out is None:
        out = torch.empty(q.shape[:3] + (v.shape[3],), dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device) if return_lse else None
    if q.is_cuda:
        ctx.set_stream(torch.cuda.current_stream(q.device).cuda_stream)
    ctx.fwd_raw(ctx.fwd_args(q, k, v, out, lse, causal, softmax_scale))
    return (out, lse) if return_lse else out
