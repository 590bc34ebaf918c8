"""_core.py - the library, its errors, contexts, and the calls on described arrays.

Everything here works on plain descriptions of arrays (pointer, fattn dtype,
shape, strides in elements), so the NumPy path and the torch path share one
way of calling fattn_fwd, fattn_fwd_fp8, fattn_bwd, fattn_quantize and fattn_kv_append.
Neither NumPy nor torch is imported here.
"""
import collections
import contextlib
import ctypes
import dataclasses
import math
import os
import sys
import threading
import weakref

from . import _capi

_here = os.path.dirname(os.path.abspath(__file__))

_E = _capi.ENUMS
OK = _E["fattn_status"]["FATTN_OK"]
ERROR_INVALID_ARGUMENT = _E["fattn_status"]["FATTN_ERROR_INVALID_ARGUMENT"]
ERROR_UNSUPPORTED = _E["fattn_status"]["FATTN_ERROR_UNSUPPORTED"]
ERROR_NO_DEVICE = _E["fattn_status"]["FATTN_ERROR_NO_DEVICE"]
ERROR_OUT_OF_MEMORY = _E["fattn_status"]["FATTN_ERROR_OUT_OF_MEMORY"]
F32 = _E["fattn_dtype"]["FATTN_DTYPE_F32"]
F16 = _E["fattn_dtype"]["FATTN_DTYPE_F16"]
BF16 = _E["fattn_dtype"]["FATTN_DTYPE_BF16"]
E4M3 = _E["fattn_dtype"]["FATTN_DTYPE_E4M3"]
BACKEND_AUTO = _E["fattn_backend"]["FATTN_BACKEND_AUTO"]
BACKEND_CPU = _E["fattn_backend"]["FATTN_BACKEND_CPU"]
BACKEND_CUDA = _E["fattn_backend"]["FATTN_BACKEND_CUDA"]
OPTION_DISABLE_SPLIT = _E["fattn_option"]["FATTN_OPTION_DISABLE_SPLIT"]
QUANT_BLOCK = _E["fattn_quant_granularity"]["FATTN_QUANT_BLOCK"]
QUANT_TENSOR = _E["fattn_quant_granularity"]["FATTN_QUANT_TENSOR"]


# ---------------------------------------------------------------------------
# The library
# ---------------------------------------------------------------------------

def library_candidates():
    """Where libfattn.so is looked for, in order: FATTN_LIBRARY alone when set
    (an override that fails is an error, never a fallback), else the library
    installed inside this package, else build/libfattn.so of the source tree
    this file is in, else the dynamic loader's search path."""
    env = os.environ.get("FATTN_LIBRARY")
    if env:
        return [env]
    cands = [os.path.join(_here, "libfattn.so")]
    root = os.path.dirname(os.path.dirname(_here))
    if os.path.isfile(os.path.join(root, "include", "fattn.h")):
        cands.append(os.path.join(root, "build", "libfattn.so"))
    cands.append("libfattn.so")
    return cands


def _load():
    tried = []
    for c in library_candidates():
        if os.sep in c and not os.path.exists(c):
            tried.append("%s (no such file)" % c)
            continue
        try:
            return _capi.bind(ctypes.CDLL(c)), c
        except OSError as e:
            tried.append("%s (%s)" % (c, e))
        except AttributeError as e:  # an old library without a symbol the bindings declare
            tried.append("%s (%s)" % (c, e))
    raise OSError("fattn: cannot load libfattn.so; tried: %s. Install the package (pip install ./python), "
                  "build the library (make), or set FATTN_LIBRARY to its path" % "; ".join(tried))


lib, library_path = _load()


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

class FattnError(RuntimeError):
    """A call into libfattn failed: `status` is the fattn_status, `detail` the
    library's fattn_last_error message.  The subclasses below also derive from
    the built-in exception that fits the status."""

    def __init__(self, status, msg):
        super().__init__("%s: %s" % (lib.fattn_status_string(status).decode(), msg))
        self.status = status
        self.detail = msg


class FattnInvalidArgumentError(FattnError, ValueError):
    """FATTN_ERROR_INVALID_ARGUMENT."""


class FattnUnsupportedError(FattnError, NotImplementedError):
    """FATTN_ERROR_UNSUPPORTED or FATTN_ERROR_NO_DEVICE: a valid request this
    build, engine or device cannot serve."""


class FattnOutOfMemoryError(FattnError, MemoryError):
    """FATTN_ERROR_OUT_OF_MEMORY."""


def error(status, msg, where=None):
    cls = {ERROR_INVALID_ARGUMENT: FattnInvalidArgumentError, ERROR_UNSUPPORTED: FattnUnsupportedError,
           ERROR_NO_DEVICE: FattnUnsupportedError, ERROR_OUT_OF_MEMORY: FattnOutOfMemoryError}.get(status, FattnError)
    return cls(status, "%s: %s" % (where, msg) if where else msg)


# ---------------------------------------------------------------------------
# Contexts
# ---------------------------------------------------------------------------

class Context:
    """A fattn context: a CUDA device (backend=BACKEND_CUDA) or the CPU
    (BACKEND_CPU); `engine` says which engine computes ("cpu", "cuda hopper
    sm_90", "cuda portable sm_86": the portable engine on GPUs other than
    Hopper from sm_80 on, or anywhere with FATTN_CUDA_ENGINE=portable).  Calls on one context are serialised by a lock (the C
    contract: a context is not for use from two threads at once).  The C
    context is freed by close(), when the object is collected, or at exit."""

    def __init__(self, backend=BACKEND_CUDA, device=0):
        h = ctypes.c_void_p()
        st = lib.fattn_ctx_create(ctypes.byref(h), _capi.check_int("backend", backend), _capi.check_int("device", device))
        if st != OK:
            raise error(st, lib.fattn_last_error(None).decode(), "fattn_ctx_create")
        self._h = h
        self._stream = None
        self._options = {}  # option -> value set through set_option (the library's default is 0)
        self._lock = threading.RLock()
        self.backend = lib.fattn_ctx_backend(h)
        # "cpu", "cuda hopper sm_90", "cuda portable sm_86", ... (fattn_ctx_engine):
        # the engine and architecture this context's calls run on
        self.engine = lib.fattn_ctx_engine(h).decode()
        self.device = device
        # A finalizer rather than __del__: it runs at exit while the module's
        # globals still exist (a __del__ at shutdown printed an ignored exception).
        self._finalizer = weakref.finalize(self, lib.fattn_ctx_free, h)

    def close(self):
        self._finalizer()
        self._h = None

    def _forget(self):
        """After fork: the child must not free (or use) the parent's threads."""
        self._finalizer.detach()
        self._h = None

    def _check(self, st, where=None):
        if st != OK:
            raise error(st, lib.fattn_last_error(self._h).decode(), where)

    def _handle(self):
        if not self._h:
            raise ValueError("fattn: this Context is closed")
        return self._h

    def set_option(self, option, value):
        with self._lock:
            self._check(lib.fattn_ctx_set_option(self._handle(), _capi.check_int("option", option),
                                                 _capi.check_int("value", value)), "fattn_ctx_set_option")
            self._options[option] = int(value)

    @contextlib.contextmanager
    def option_set(self, option, value):
        """Hold the context's lock with `option` set to `value`, then set it back
        to what it was (for one call that asks for it, e.g. no split)."""
        with self._lock:
            old = self._options.get(option, 0)
            if old == int(value):
                yield self
                return
            self.set_option(option, value)
            try:
                yield self
            finally:
                self.set_option(option, old)

    def set_threads(self, threads):
        with self._lock:
            self._check(lib.fattn_ctx_set_threads(self._handle(), _capi.check_int("threads", threads)),
                        "fattn_ctx_set_threads")

    def set_stream(self, stream_ptr):
        with self._lock:
            if stream_ptr != self._stream:
                self._check(lib.fattn_ctx_set_stream(self._handle(), ctypes.c_void_p(stream_ptr)),
                            "fattn_ctx_set_stream")
                self._stream = stream_ptr

    def fwd_args(self, q, k, v, out, lse=None, causal=False, softmax_scale=0.0):
        """The argument struct of one forward call (torch tensors or NumPy
        arrays [b, s, h, d], head dim contiguous, each with its own dtype;
        softmax_scale 0 = 1/sqrt(head_dim)), built once for timing loops and
        run with fwd_raw.  The struct holds pointers: keep the arrays alive."""
        qd, kd, vd, od = (describe(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out")))
        for d in (qd, kd, vd, od):
            if d.c_strides is None:
                raise ValueError("fattn: %s's layout %s with strides %s is not [b, s, h, d] with d contiguous"
                                 % (d.name, d.shape, d.strides))
        dims = check_shapes(qd.shape, kd.shape, vd.shape)
        if tuple(od.shape) != dims.o_shape:
            raise ValueError("fattn: out has shape %s, expected %s" % (tuple(od.shape), dims.o_shape))
        if lse is not None:
            ld = describe(lse, "lse", allow=(F32,))
            if tuple(ld.shape) != dims.lse_shape or not ld.contiguous:
                raise ValueError("fattn: lse must be a contiguous float32 %s" % (dims.lse_shape,))
        a = fwd_struct(dims, qd, kd, vd, od, lse_ptr(lse) if lse is not None else None, causal, softmax_scale)
        a._keep = (q, k, v, out, lse)
        return a

    def fwd_raw(self, args):
        with self._lock:
            self._check(lib.fattn_fwd(self._handle(), ctypes.byref(args)), "fattn_fwd")

    def bwd_raw(self, args):
        with self._lock:
            self._check(lib.fattn_bwd(self._handle(), ctypes.byref(args)), "fattn_bwd")

    def fwd_fp8_raw(self, args, opt):
        """fattn_fwd_fp8 on a fattn_fwd_args struct and a fattn_fp8_options one
        (_capi.Fp8Options, e.g. FP8(...).options(); None = the library's default)."""
        with self._lock:
            self._check(lib.fattn_fwd_fp8(self._handle(), ctypes.byref(args),
                                          ctypes.byref(opt) if opt is not None else None), "fattn_fwd_fp8")

    def quantize_raw(self, args):
        with self._lock:
            self._check(lib.fattn_quantize(self._handle(), ctypes.byref(args)), "fattn_quantize")

    def kv_append_raw(self, args):
        """fattn_kv_append on a fattn_kv_append_args struct (_capi.KvAppendArgs)."""
        with self._lock:
            self._check(lib.fattn_kv_append(self._handle(), ctypes.byref(args)), "fattn_kv_append")


_contexts = {}
_contexts_lock = threading.Lock()


def context(backend, device=0):
    """The shared context of (backend, device), made on first use: one per CUDA
    device and one for the CPU, so a call never runs on another device's
    context."""
    key = (backend, 0 if backend == BACKEND_CPU else int(device))
    c = _contexts.get(key)
    if c is None:
        with _contexts_lock:
            c = _contexts.get(key)
            if c is None:
                c = _contexts[key] = Context(backend, key[1])
    return c


def _after_fork_in_child():
    for c in _contexts.values():
        c._forget()
    _contexts.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------
# Array descriptions
# ---------------------------------------------------------------------------

Desc = collections.namedtuple("Desc", "name ptr dtype shape strides c_strides contiguous")

_TORCH_DTYPES = {"torch.float32": F32, "torch.float16": F16, "torch.bfloat16": BF16, "torch.float8_e4m3fn": E4M3}
_NUMPY_DTYPES = {"float32": F32, "float16": F16, "bfloat16": BF16}  # bfloat16: ml_dtypes' NumPy dtype
DTYPE_NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16", E4M3: "float8_e4m3fn"}


def is_numpy(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def fattn_dtype(x):
    """fattn_dtype of a torch tensor or NumPy array, None when fattn has none."""
    if is_numpy(x):
        return _NUMPY_DTYPES.get(x.dtype.name)
    return _TORCH_DTYPES.get(str(x.dtype))


def c_strides(shape, strides):
    """(stride_batch, stride_seq, stride_head) for fattn_tensor, in elements,
    or None when fattn cannot read the layout as it is (head dim not
    contiguous, a negative or zero stride along a dimension longer than one,
    heads/tokens/batches closer than a row).  The stride of a dimension of
    size 1 is never used: it gets a packed value, so that the three strides
    are never all 0 (which the C API reads as 'packed')."""
    if len(shape) != 4:
        return None
    b, s, h, d = shape
    if d > 1 and strides[3] != 1:
        return None
    packed = (s * h * d, h * d, d)
    out = []
    for size, st, pk in zip((b, s, h), strides[:3], packed):
        if size <= 1:
            out.append(max(pk, 1))
        elif st < max(d, 1):
            return None
        else:
            out.append(st)
    return tuple(out)


def non_overlapping(shape, strides):
    """No two elements share an address (what an output needs)."""
    dims = sorted((st, size) for size, st in zip(shape, strides) if size > 1)
    extent = 1
    for st, size in dims:
        if st < extent:
            return False
        extent = st * (size - 1) + extent
    return True


def _contiguous(shape, strides):
    expect = 1
    for size, st in zip(reversed(shape), reversed(strides)):
        if size != 1 and st != expect:
            return False
        expect *= size
    return True


def describe(x, name, allow=(F32, F16, BF16, E4M3)):
    """Desc of a torch tensor or NumPy array; TypeError for another type or a
    dtype fattn has no code for."""
    dt = fattn_dtype(x) if (is_numpy(x) or hasattr(x, "data_ptr")) else None
    if dt is None or dt not in allow:
        if not (is_numpy(x) or hasattr(x, "data_ptr")):
            raise TypeError("fattn: %s is a %s; fattn takes torch tensors or NumPy arrays" % (name, type(x).__name__))
        raise TypeError("fattn: %s has dtype %s; fattn takes %s" % (
            name, x.dtype, ", ".join(DTYPE_NAMES[a] for a in allow)))
    if is_numpy(x):
        if not x.dtype.isnative:  # '>f4' on a little-endian machine: the C library reads native words
            raise TypeError("fattn: %s has dtype %s in non-native byte order; convert it first with "
                            "x.astype(x.dtype.newbyteorder('='))" % (name, x.dtype.str))
        item = x.dtype.itemsize
        if any(st % item for st in x.strides):
            strides = None
        else:
            strides = tuple(st // item for st in x.strides)
        ptr = x.ctypes.data
        shape = tuple(x.shape)
    else:
        strides = tuple(x.stride())
        ptr = x.data_ptr()
        shape = tuple(x.shape)
    cs = c_strides(shape, strides) if strides is not None else None
    return Desc(name, ptr, dt, shape, strides, cs, strides is not None and _contiguous(shape, strides))


def tensor_struct(d, scale_ptr=None, scale_block=0):
    return _capi.Tensor(d.ptr, d.dtype, d.c_strides[0], d.c_strides[1], d.c_strides[2], scale_ptr, scale_block)


def lse_ptr(lse):
    return lse.ctypes.data if is_numpy(lse) else lse.data_ptr()


# ---------------------------------------------------------------------------
# Shapes, scale
# ---------------------------------------------------------------------------

_INT32_MAX = 2 ** 31 - 1


class Dims(collections.namedtuple("Dims", "b sq sk hq hkv d dv")):
    @property
    def o_shape(self):
        return (self.b, self.sq, self.hq, self.dv)

    @property
    def lse_shape(self):
        return (self.b, self.hq, self.sq)

    @property
    def empty(self):
        """No output element, or no key: fattn_fwd is not called."""
        return self.b == 0 or self.sq == 0 or self.hq == 0 or self.sk == 0


def _check_dims(d, dk, dv, hq, hkv, k_name, kv_name):
    """Head dims (q's d against k's dk, v's dv) and the GQA ratio, shared by the forward's and the
    decoding call's shape checks; the names say which tensors the message speaks of."""
    if dk != d:
        raise ValueError("fattn: q's head dim %d differs from %s %d" % (d, k_name, dk))
    if d < 1 or dv < 1:
        raise ValueError("fattn: head dims must be >= 1 (q/k %d, v %d)" % (d, dv))
    if hkv < 1 and hq > 0 or hkv > 0 and hq % hkv != 0:
        raise ValueError("fattn: q's %d heads are not a multiple of %s %d (GQA needs heads_q %% heads_kv == 0)"
                         % (hq, kv_name, hkv))


def check_shapes(qs, ks, vs):
    """Dims of q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv];
    ValueError naming the mismatch otherwise."""
    for n, s in (("q", qs), ("k", ks), ("v", vs)):
        if len(s) != 4:
            raise ValueError("fattn: %s must be 4-D [batch, seqlen, heads, head_dim], got shape %s" % (n, tuple(s)))
    b, sq, hq, d = qs
    if ks[0] != b or vs[0] != b:
        raise ValueError("fattn: batch sizes differ: q %s, k %s, v %s" % (tuple(qs), tuple(ks), tuple(vs)))
    if ks[1] != vs[1] or ks[2] != vs[2]:
        raise ValueError("fattn: k %s and v %s differ in seqlen or heads" % (tuple(ks), tuple(vs)))
    hkv = ks[2]
    _check_dims(d, ks[3], vs[3], hq, hkv, "k's", "k/v's")
    return Dims(b, sq, ks[1], hq, hkv, d, vs[3])


class VarlenDims(collections.namedtuple("VarlenDims", "dims total_q total_k")):
    """The shapes of a variable-length call: dims (the Dims fattn_problem gets: b the
    sequence count, sq and sk the longest sequence's lengths, max_seqlen_q/k), total_q
    the packed rows of q and o, total_k those of k and v."""

    @property
    def o_shape(self):
        return (self.total_q, self.dims.hq, self.dims.dv)

    @property
    def lse_shape(self):
        return (self.dims.hq, self.total_q)

    @property
    def empty(self):
        """No output element, or no key in the whole batch: fattn_fwd is not called."""
        return self.total_q == 0 or self.dims.hq == 0 or self.total_k == 0


def check_varlen_shapes(qs, ks, vs, batch, max_seqlen_q, max_seqlen_k):
    """VarlenDims of packed q [total_q, hq, d], k [total_k, hkv, d], v [total_k, hkv, dv]
    holding `batch` sequences, the longest max_seqlen_q queries and max_seqlen_k keys
    (ints); ValueError naming the mismatch otherwise.  The cu_seqlens themselves are
    not read here (they may be device memory)."""
    for n, s in (("q", qs), ("k", ks), ("v", vs)):
        if len(s) != 3:
            raise ValueError("fattn: %s must be 3-D [total_tokens, heads, head_dim] (the sequences packed along "
                             "the first dimension), got shape %s" % (n, tuple(s)))
    total_q, hq, d = qs
    if ks[0] != vs[0] or ks[1] != vs[1]:
        raise ValueError("fattn: k %s and v %s differ in tokens or heads" % (tuple(ks), tuple(vs)))
    _check_dims(d, ks[2], vs[2], hq, ks[1], "k's", "k/v's")
    for n, x in (("batch (len(cu_seqlens) - 1)", batch), ("max_seqlen_q", max_seqlen_q),
                 ("max_seqlen_k", max_seqlen_k), ("total_q (q.shape[0])", total_q),
                 ("total_k (k.shape[0])", ks[0])):
        if not 0 <= x <= _INT32_MAX:
            raise ValueError("fattn: %s is %d, must be in [0, 2**31)" % (n, x))
    if batch < 1:
        raise ValueError("fattn: a variable-length batch needs at least one sequence (cu_seqlens of >= 2 entries)")
    return VarlenDims(Dims(batch, max_seqlen_q, max_seqlen_k, hq, ks[1], d, vs[2]), total_q, ks[0])


def resolve_scale(softmax_scale, head_dim):
    """None -> 1/sqrt(head_dim), as FlashAttention; else a finite value > 0."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    s = float(softmax_scale)
    if not (s > 0.0 and math.isfinite(s)):
        raise ValueError("fattn: softmax_scale must be finite and > 0 (None = 1/sqrt(head_dim)), got %r"
                         % (softmax_scale,))
    return s


# ---------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------

# The variable-length fields of fattn_problem: the int32 [batch + 1] cu_seqlens arrays
# (pointers, where the context computes) and the packed rows total_q, total_k.
Varlen = collections.namedtuple("Varlen", "cu_seqlens_q cu_seqlens_k total_q total_k")


def problem(dims, causal, softmax_scale, varlen=None):
    """fattn_problem of dims; varlen: None (fixed-length) or a Varlen, with the
    tensors then described as batch 1 (fattn.h: stride_batch is not used)."""
    p = _capi.Problem(dims.b, dims.sq, dims.sk, dims.hq, dims.hkv, dims.d, dims.dv,
                      float(softmax_scale), int(bool(causal)), None, None)
    if varlen is not None:
        p.cu_seqlens_q, p.cu_seqlens_k, p.total_q, p.total_k = varlen
    return p


# The attention variants of fattn_problem / fattn_fwd_args (fattn.h): window_size
# (left, right) with -1 unbounded, None = no window; softcap 0 = off; learnable_sink
# a pointer to float32 [heads_q] where the context computes, or None.
Variants = collections.namedtuple("Variants", "window_size softcap learnable_sink")
NO_VARIANTS = Variants(None, 0.0, None)


def check_window_size(where, window_size):
    """None for (-1, -1) (no window), else the pair of ints (each >= -1)."""
    ws = tuple(window_size) if window_size is not None else (-1, -1)
    if len(ws) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in ws):
        raise ValueError("%s: window_size must be a pair of ints (left, right), got %r" % (where, window_size))
    if ws[0] < -1 or ws[1] < -1:
        raise ValueError("%s: window_size %r: each side is >= 0, or -1 for unbounded" % (where, ws))
    return None if ws == (-1, -1) else ws


def set_variants(p, variants):
    """The variants' fields of a fattn_problem p."""
    if variants.window_size is not None:
        p.window = 1
        p.window_left, p.window_right = variants.window_size
    p.softcap = float(variants.softcap)


def fwd_struct(dims, qd, kd, vd, od, lse, causal, softmax_scale, varlen=None, seqused_k=None,
               variants=NO_VARIANTS, seqused_q=None):
    a = _capi.FwdArgs()
    a.p = problem(dims, causal, softmax_scale, varlen)
    set_variants(a.p, variants)
    a.learnable_sink = variants.learnable_sink
    a.q, a.k, a.v = tensor_struct(qd), tensor_struct(kd), tensor_struct(vd)
    a.o = tensor_struct(od)
    a.lse = lse
    a.seqused_k = seqused_k
    a.seqused_q = seqused_q
    return a


def run_fwd(ctx, dims, qd, kd, vd, od, lse, causal, softmax_scale, varlen=None, seqused_k=None,
            variants=NO_VARIANTS, seqused_q=None):
    ctx.fwd_raw(fwd_struct(dims, qd, kd, vd, od, lse, causal, softmax_scale, varlen, seqused_k, variants, seqused_q))


def run_bwd(ctx, dims, qd, kd, vd, od, dod, dqd, dkd, dvd, lse, causal, softmax_scale, deterministic, varlen=None,
            variants=NO_VARIANTS, dsink=None, seqused_q=None, seqused_k=None):
    """fattn_bwd; variants: the forward's (its learnable_sink is read only for dsink, a
    pointer to float32 [heads_q] or None: fattn.h); seqused_q, seqused_k: pointers to
    int32 [batch] or None, the forward's (fattn_bwd_args)."""
    a = _capi.BwdArgs()
    a.p = problem(dims, causal, softmax_scale, varlen)
    set_variants(a.p, variants)
    a.q, a.k, a.v, a.o, a.dout = (tensor_struct(x) for x in (qd, kd, vd, od, dod))
    a.dq, a.dk, a.dv = (tensor_struct(x) for x in (dqd, dkd, dvd))
    a.lse = lse
    a.deterministic = int(bool(deterministic))
    if dsink is not None:
        a.learnable_sink, a.dsink = variants.learnable_sink, dsink
    a.seqused_q, a.seqused_k = seqused_q, seqused_k
    ctx.bwd_raw(a)


# ---------------------------------------------------------------------------
# FP8
# ---------------------------------------------------------------------------

_GRANULARITIES = {"block": QUANT_BLOCK, "tensor": QUANT_TENSOR}


class Fp8GradError(NotImplementedError, ValueError):
    """fp8 attention asked for on inputs that require grad: FP8 attention has no
    backward.  A NotImplementedError (what fattn raised before) and a ValueError."""


@dataclasses.dataclass(frozen=True)
class FP8:
    """How fattn.attention(..., fp8=FP8(...)) quantises q, k and v to e4m3
    before the e4m3 forward (fattn_fwd_fp8 and its fattn_fp8_options).

    granularity: "block" (one scale per block_q / block_k / block_v rows of
      each batch and head) or "tensor" (one scale for the whole tensor; the
      block sizes are then unused).
    block_q, block_k, block_v: rows per scale, >= 1; block_k=1 is one scale
      per token.  The CUDA engine serves block_k 1 or a multiple of 128 and
      block_v a multiple of 128 (others raise FattnUnsupportedError).
    rotate: multiply the rows of Q and K by a random-sign Walsh-Hadamard matrix
      first (FlashAttention-3's incoherent processing; head_dim a power of two).
    seed: picks the rotation's signs (0 <= seed < 2**64).
    fp8=True is FP8(): block scales of 128 rows, no rotation."""
    granularity: str = "block"
    block_q: int = 128
    block_k: int = 128
    block_v: int = 128
    rotate: bool = False
    seed: int = 0

    def __post_init__(self):
        if self.granularity not in _GRANULARITIES:
            raise ValueError("fattn.FP8: granularity must be 'block' or 'tensor', got %r" % (self.granularity,))
        for n in ("block_q", "block_k", "block_v"):
            x = getattr(self, n)
            if isinstance(x, bool) or not isinstance(x, int):
                raise TypeError("fattn.FP8: %s must be an int, got %r" % (n, x))
            if not 1 <= x <= 2 ** 31 - 1:
                raise ValueError("fattn.FP8: %s must be >= 1 rows per scale, got %d" % (n, x))
        if not isinstance(self.rotate, bool):
            raise TypeError("fattn.FP8: rotate must be a bool, got %r" % (self.rotate,))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 64:
            raise ValueError("fattn.FP8: seed must be an int in [0, 2**64), got %r" % (self.seed,))

    def options(self):
        """The fattn_fp8_options struct (_capi.Fp8Options) of these settings."""
        return _capi.Fp8Options(_GRANULARITIES[self.granularity], self.block_q, self.block_k, self.block_v,
                                int(self.rotate), self.seed)


def fp8_config(fp8):
    """None (FP8 off) or an FP8: fp8 is None or False (off), True (FP8()) or an
    FP8; TypeError for anything else."""
    if fp8 is None or fp8 is False:
        return None
    if fp8 is True:
        return FP8()
    if isinstance(fp8, FP8):
        return fp8
    raise TypeError("fattn: fp8 must be None, False, True or a fattn.FP8(...), got a %s" % type(fp8).__name__)


def fp8_grad_error():
    return Fp8GradError("fattn: fp8 attention is forward only: the backward of FP8 attention is not implemented "
                        "(fattn_bwd takes f32, f16 and bf16); call it under torch.no_grad() or on tensors that do "
                        "not require grad, or leave fp8 unset")


def run_fwd_fp8(ctx, dims, qd, kd, vd, od, lse, causal, softmax_scale, fp8, variants=NO_VARIANTS):
    """fattn_fwd_fp8: q, k, v (16-bit or f32) quantised to e4m3 as the FP8
    `fp8` says, into the context's workspace, then the e4m3 forward into od."""
    ctx.fwd_fp8_raw(fwd_struct(dims, qd, kd, vd, od, lse, causal, softmax_scale, variants=variants), fp8.options())


# ---------------------------------------------------------------------------
# KV caches (decoding): fattn_kv_append, then fattn_fwd on the cache
# ---------------------------------------------------------------------------

class KvDims(collections.namedtuple("KvDims", "dims paged capacity page_size num_pages max_pages seqlen_new")):
    """The shapes of a decoding call: dims (Dims of the forward: sk is the key
    count of a sequence, the contiguous cache's capacity or max_pages *
    page_size); paged; capacity (contiguous: rows per sequence, else 0);
    page_size, num_pages, max_pages (paged, else 0); seqlen_new (rows to
    append per sequence, 0 for none)."""


def check_kvcache_shapes(qs, kcs, vcs, ks=None, vs=None, table_shape=None, cache_batch=False):
    """KvDims of q [b, sq, hq, d] and the caches: k_cache [b, capacity, hkv, d]
    and v_cache [b, capacity, hkv, dv], or with a page table [b, max_pages]
    page pools [num_pages, page_size, hkv, d] and [.., dv]; k [b, s_new, hkv, d]
    and v [b, s_new, hkv, dv] the rows to append (both or neither).  ValueError
    naming the mismatch otherwise."""
    for n, s in (("q", qs), ("k_cache", kcs), ("v_cache", vcs), ("k", ks), ("v", vs)):
        if s is not None and len(s) != 4:
            raise ValueError("fattn: %s must be 4-D, got shape %s" % (n, tuple(s)))
    qs, kcs, vcs = tuple(qs), tuple(kcs), tuple(vcs)
    b, sq, hq, d = qs
    paged = table_shape is not None
    if paged:
        table_shape = tuple(table_shape)
        if len(table_shape) != 2 or table_shape[0] != b:
            raise ValueError("fattn: page_table must be [batch, max_pages_per_seq] with q's batch %d, got shape %s"
                             % (b, table_shape))
        num_pages, page_size, max_pages = kcs[0], kcs[1], table_shape[1]
        capacity, sk = 0, max_pages * page_size
    else:
        if kcs[0] != b and not cache_batch:
            raise ValueError("fattn: k_cache has batch %d, q %d (a cache of other sequences than q's needs "
                             "cache_batch_idx)" % (kcs[0], b))
        num_pages = page_size = max_pages = 0
        capacity = sk = kcs[1]
    if vcs[:3] != kcs[:3]:
        raise ValueError("fattn: k_cache %s and v_cache %s differ in their first three dimensions" % (kcs, vcs))
    hkv = kcs[2]
    _check_dims(d, kcs[3], vcs[3], hq, hkv, "k_cache's", "the cache's")
    if sk > _INT32_MAX:
        raise ValueError("fattn: %d keys per sequence (max_pages_per_seq %d x page_size %d) do not fit int32"
                         % (sk, max_pages, page_size))
    s_new = 0
    if (ks is None) != (vs is None):
        raise ValueError("fattn: k and v (the rows to append) must be given together")
    if ks is not None:
        ks, vs = tuple(ks), tuple(vs)
        s_new = ks[1]
        if ks != (b, s_new, hkv, d):
            raise ValueError("fattn: k must be [batch, seqlen_new, heads_kv, head_dim] = %s, got %s"
                             % ((b, s_new, hkv, d), ks))
        if vs != (b, s_new, hkv, vcs[3]):
            raise ValueError("fattn: v must be [batch, seqlen_new, heads_kv, head_dim_v] = %s, got %s"
                             % ((b, s_new, hkv, vcs[3]), vs))
    return KvDims(Dims(b, sq, sk, hq, hkv, d, vcs[3]), paged, capacity, page_size, num_pages, max_pages, s_new)


def cache_structs(kcd, vcd, scales):
    """fattn_tensors of the caches; scales: None, or an e4m3 cache's (k scale
    pointer, k scale_block, v scale pointer, v scale_block)."""
    if scales is None:
        return tensor_struct(kcd), tensor_struct(vcd)
    return tensor_struct(kcd, scales[0], scales[1]), tensor_struct(vcd, scales[2], scales[3])


def kv_append_struct(kv, knd, vnd, kcd, vcd, cache_seqlens, block_table, scales=None):
    """fattn_kv_append_args of appending k (knd) and v (vnd) to the caches kcd,
    vcd (Descs) at the rows int32 cache_seqlens (a pointer) says; block_table:
    the int32 [batch, max_pages] table's pointer when paged; scales: an e4m3
    cache's (cache_structs)."""
    a = _capi.KvAppendArgs()
    a.batch, a.seqlen_new, a.heads_kv, a.head_dim = kv.dims.b, kv.seqlen_new, kv.dims.hkv, kv.dims.d
    a.k_new, a.v_new = tensor_struct(knd), tensor_struct(vnd)
    a.k_cache, a.v_cache = cache_structs(kcd, vcd, scales)
    a.capacity = kv.capacity
    a.cache_seqlens = cache_seqlens
    if kv.paged:
        a.block_table = block_table
        a.page_size, a.num_pages, a.max_pages_per_seq = kv.page_size, kv.num_pages, kv.max_pages
    return a


def fwd_kvcache_struct(kv, qd, kcd, vcd, od, lse, causal, softmax_scale, seqused_k, block_table,
                       variants=NO_VARIANTS, scales=None, cache_batch_idx=None, cache_batch=0, cache_leftpad=None):
    """fattn_fwd_args of attention over a cache: kcd, vcd the contiguous caches
    or the page pools (their batch dimension is the page, as fattn.h says),
    seqused_k the int32 [batch] used key counts (a pointer, or None = all);
    scales: an e4m3 cache's (cache_structs)."""
    a = fwd_struct(kv.dims, qd, kcd, vcd, od, lse, causal, softmax_scale, seqused_k=seqused_k, variants=variants)
    a.k, a.v = cache_structs(kcd, vcd, scales)
    if kv.paged:
        a.block_table = block_table
        a.page_size, a.num_pages, a.max_pages_per_seq = kv.page_size, kv.num_pages, kv.max_pages
    # FA3's cache_batch_idx (a contiguous cache of cache_batch entries) and cache_leftpad (pointers or None)
    a.cache_batch_idx, a.cache_leftpad = cache_batch_idx, cache_leftpad
    a.cache_batch = cache_batch if cache_batch_idx else 0
    return a
