"""_capi.py - the ctypes mirror of include/fattn.h: enums, structs and prototypes.

Nothing here loads the library or imports the rest of the package, so that
python/tests/test_capi.py can load this file on its own and check every enum
value, every struct field (name, type, order) and every prototype against the
header: edit both together, or the ctest `python_capi` fails.
"""
import ctypes

# The header's version macros (FATTN_VERSION_MAJOR/MINOR/PATCH).
VERSION = (0, 5, 0)

# typedef enum name -> {enumerator: value}, in the header's order.
ENUMS = {
    "fattn_status": {
        "FATTN_OK": 0,
        "FATTN_ERROR_INVALID_ARGUMENT": 1,
        "FATTN_ERROR_UNSUPPORTED": 2,
        "FATTN_ERROR_NO_DEVICE": 3,
        "FATTN_ERROR_OUT_OF_MEMORY": 4,
        "FATTN_ERROR_CUDA": 5,
        "FATTN_ERROR_INTERNAL": 6,
        "FATTN_ERROR_BUSY": 7,
    },
    "fattn_backend": {
        "FATTN_BACKEND_AUTO": 0,
        "FATTN_BACKEND_CPU": 1,
        "FATTN_BACKEND_CUDA": 2,
    },
    "fattn_option": {
        "FATTN_OPTION_DISABLE_OVERLAP": 0,
        "FATTN_OPTION_DISABLE_PINGPONG": 1,
        "FATTN_OPTION_DISABLE_PDL": 2,
        "FATTN_OPTION_SOFTMAX_UNDER_PV": 3,
        "FATTN_OPTION_DISABLE_SPLIT": 4,
        "FATTN_OPTION_COUNT_": 5,
    },
    "fattn_dtype": {
        "FATTN_DTYPE_F32": 0,
        "FATTN_DTYPE_F16": 1,
        "FATTN_DTYPE_BF16": 2,
        "FATTN_DTYPE_E4M3": 3,
    },
    "fattn_quant_granularity": {
        "FATTN_QUANT_BLOCK": 0,
        "FATTN_QUANT_TENSOR": 1,
    },
}

# C enums are passed and stored as int (every value fits; the header has no
# fixed underlying type).  Pointer fields are c_void_p, so that an address
# (a tensor's data_ptr()) can be assigned as an int; the layout is the same.
c_enum = ctypes.c_int

# Integer fields and their ranges: ctypes stores a Python int into a c_int32
# field modulo 2**32 without a word (2**32 + 3 becomes 3), so every store is
# checked here and a value that does not fit raises ValueError naming the
# field (issue 43).
_INT_RANGES = {ctypes.c_int32: (-2**31, 2**31), ctypes.c_int64: (-2**63, 2**63), ctypes.c_uint64: (0, 2**64)}
_INT_NAMES = {ctypes.c_int32: "int32", ctypes.c_int64: "int64", ctypes.c_uint64: "uint64"}


def check_int(name, value, ctype=ctypes.c_int32):
    """value as an int, ValueError when it does not fit ctype (named `name`)."""
    lo, hi = _INT_RANGES[ctype]
    v = int(value)
    if not lo <= v < hi:
        raise ValueError("fattn: %s = %d does not fit the C API's %s (must be in [%d, %d))"
                         % (name, v, _INT_NAMES[ctype], lo, hi))
    return v


class _Struct(ctypes.Structure):
    """A C struct whose integer fields refuse values that would wrap."""

    def __setattr__(self, name, value):
        t = _FIELD_TYPES.get((type(self), name))
        if t is not None and not isinstance(value, ctypes._SimpleCData):
            value = check_int("%s.%s" % (type(self)._c_name_, name), value, t)
        super().__setattr__(name, value)


_FIELD_TYPES = {}  # (struct class, field) -> ctype, for the integer fields; filled below


class Tensor(_Struct):
    _c_name_ = "fattn_tensor"
    _fields_ = [("data", ctypes.c_void_p), ("dtype", c_enum), ("stride_batch", ctypes.c_int64),
                ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64),
                ("scale", ctypes.c_void_p), ("scale_block", ctypes.c_int32)]


class Problem(_Struct):
    _c_name_ = "fattn_problem"
    _fields_ = [("batch", ctypes.c_int32), ("seqlen_q", ctypes.c_int32), ("seqlen_k", ctypes.c_int32),
                ("heads_q", ctypes.c_int32), ("heads_kv", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("head_dim_v", ctypes.c_int32), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32),
                ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p), ("total_q", ctypes.c_int32),
                ("total_k", ctypes.c_int32), ("window", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float)]


class FwdArgs(_Struct):
    _c_name_ = "fattn_fwd_args"
    _fields_ = [("p", Problem), ("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor),
                ("lse", ctypes.c_void_p), ("seqused_k", ctypes.c_void_p), ("block_table", ctypes.c_void_p),
                ("page_size", ctypes.c_int32), ("num_pages", ctypes.c_int32),
                ("max_pages_per_seq", ctypes.c_int32), ("learnable_sink", ctypes.c_void_p),
                ("seqused_q", ctypes.c_void_p), ("cache_batch_idx", ctypes.c_void_p),
                ("cache_batch", ctypes.c_int32), ("cache_leftpad", ctypes.c_void_p)]


class BwdArgs(_Struct):
    _c_name_ = "fattn_bwd_args"
    _fields_ = [("p", Problem), ("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor),
                ("dout", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
                ("lse", ctypes.c_void_p), ("deterministic", ctypes.c_int32),
                ("learnable_sink", ctypes.c_void_p), ("dsink", ctypes.c_void_p),
                ("seqused_q", ctypes.c_void_p), ("seqused_k", ctypes.c_void_p)]


class QuantizeArgs(_Struct):
    _c_name_ = "fattn_quantize_args"
    _fields_ = [("in", Tensor), ("out", Tensor), ("batch", ctypes.c_int32), ("seqlen", ctypes.c_int32),
                ("heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("granularity", c_enum),
                ("block_rows", ctypes.c_int32), ("rotate", ctypes.c_int32), ("seed", ctypes.c_uint64)]


class Fp8Options(_Struct):
    _c_name_ = "fattn_fp8_options"
    _fields_ = [("granularity", c_enum), ("block_rows_q", ctypes.c_int32), ("block_rows_k", ctypes.c_int32),
                ("block_rows_v", ctypes.c_int32), ("rotate", ctypes.c_int32), ("seed", ctypes.c_uint64)]


class MergePart(_Struct):
    _c_name_ = "fattn_merge_part"
    _fields_ = [("o", Tensor), ("lse", ctypes.c_void_p)]


class MergeArgs(_Struct):
    _c_name_ = "fattn_merge_args"
    _fields_ = [("batch", ctypes.c_int32), ("seqlen", ctypes.c_int32), ("heads", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("num_parts", ctypes.c_int32), ("parts", ctypes.c_void_p),
                ("o", Tensor), ("lse", ctypes.c_void_p)]


class KvAppendArgs(_Struct):
    _c_name_ = "fattn_kv_append_args"
    _fields_ = [("batch", ctypes.c_int32), ("seqlen_new", ctypes.c_int32), ("heads_kv", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("k_new", Tensor), ("v_new", Tensor), ("k_cache", Tensor),
                ("v_cache", Tensor), ("capacity", ctypes.c_int32), ("cache_seqlens", ctypes.c_void_p),
                ("block_table", ctypes.c_void_p), ("page_size", ctypes.c_int32), ("num_pages", ctypes.c_int32),
                ("max_pages_per_seq", ctypes.c_int32)]


STRUCTS = [Tensor, Problem, FwdArgs, BwdArgs, QuantizeArgs, Fp8Options, MergePart, MergeArgs, KvAppendArgs]
for _s in STRUCTS:
    for _name, _t in _s._fields_:
        if _t in _INT_RANGES:
            _FIELD_TYPES[(_s, _name)] = _t

_ctx = ctypes.c_void_p  # fattn_ctx * (opaque)
_P = ctypes.POINTER

# Every FATTN_API function of the header: name -> (restype, argtypes).
PROTOTYPES = {
    "fattn_version_string": (ctypes.c_char_p, []),
    "fattn_version_number": (ctypes.c_int, []),
    "fattn_status_string": (ctypes.c_char_p, [c_enum]),
    "fattn_ctx_create": (c_enum, [_P(_ctx), c_enum, ctypes.c_int]),
    "fattn_ctx_free": (None, [_ctx]),
    "fattn_ctx_backend": (c_enum, [_ctx]),
    "fattn_ctx_engine": (ctypes.c_char_p, [_ctx]),
    "fattn_ctx_set_stream": (c_enum, [_ctx, ctypes.c_void_p]),
    "fattn_ctx_set_threads": (c_enum, [_ctx, ctypes.c_int]),
    "fattn_ctx_set_option": (c_enum, [_ctx, c_enum, ctypes.c_int]),
    "fattn_last_error": (ctypes.c_char_p, [_ctx]),
    "fattn_dtype_size": (ctypes.c_size_t, [c_enum]),
    "fattn_dtype_name": (ctypes.c_char_p, [c_enum]),
    "fattn_tensor_bshd": (Tensor, [ctypes.c_void_p, c_enum]),
    "fattn_fwd": (c_enum, [_ctx, _P(FwdArgs)]),
    "fattn_bwd": (c_enum, [_ctx, _P(BwdArgs)]),
    "fattn_merge": (c_enum, [_ctx, _P(MergeArgs)]),
    "fattn_kv_append": (c_enum, [_ctx, _P(KvAppendArgs)]),
    "fattn_quantize": (c_enum, [_ctx, _P(QuantizeArgs)]),
    "fattn_fwd_fp8": (c_enum, [_ctx, _P(FwdArgs), _P(Fp8Options)]),
    "fattn_f32_to_e4m3": (ctypes.c_uint8, [ctypes.c_float]),
    "fattn_e4m3_to_f32": (ctypes.c_float, [ctypes.c_uint8]),
    "fattn_rotation_signs": (c_enum, [ctypes.c_uint64, ctypes.c_int32, _P(ctypes.c_float)]),
}


def bind(lib):
    """Set restype and argtypes of every prototype on a loaded ctypes.CDLL."""
    for name, (res, args) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib
