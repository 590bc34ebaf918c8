"""fattn: Python bindings (ctypes) over the fattn C library.

    import torch, fattn
    o = fattn.attention(q, k, v, causal=True)       # q [b, s, h, d]: CUDA (sm_80 on) or CPU tensors

    o = fattn.flash_attn_func(q, k, v, causal=True)  # FlashAttention-3's signature

    # packed variable-length batch: q [total_q, h, d], cu_seqlens int32 [batch + 1] (FA3's signature)
    o = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal=True)

    # decoding: append k, v into the cache in place, then attend (FA3's signature)
    o = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True)

Inputs are torch tensors (CUDA, or CPU through the CPU engine) or NumPy arrays
(CPU engine) in [batch, seqlen, heads, head_dim] layout, GQA by fewer K/V
heads.  fp8=True or fp8=fattn.FP8(...) runs FP8 attention (forward only).
On torch tensors the call is the custom op torch.ops.fattn.fwd (fwd_fp8):
differentiable (CPU engine; on Hopper at head dims 64, 96, 128, 192, 256 and 192/128, on every other
GPU from sm_80 on, the portable engine, at 64, 96, 128, 192, 256) and traceable by torch.compile.
Context(...).engine names the engine and architecture ("cuda portable sm_86", ...).  window_size, softcap and learnable_sink (FA3's and
FA4's names) are arguments of every entry point, with their gradients.  Library errors raise FattnError (with the
library's message) or a subclass: FattnInvalidArgumentError (a ValueError)
and FattnUnsupportedError (a NotImplementedError).

fattn.hf.register() makes attn_implementation="fattn" available to Hugging Face
transformers models.

The library is FATTN_LIBRARY when set, else the libfattn.so installed in this
package (pip install ./python), else build/libfattn.so of the source tree,
else the system's libfattn.so.  docs/python.md has the details.
"""
import sys as _sys

from . import _capi
from ._core import (FP8, Context, FattnError, FattnInvalidArgumentError, FattnOutOfMemoryError,  # noqa: F401
                    FattnUnsupportedError, library_path)
from . import _core
from ._merge import merge  # noqa: F401, E402 - fattn_merge (fattn.h); in __all__

_lib = _core.lib

__all__ = ["attention", "merge", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "FP8", "Context",
           "FattnError", "FattnInvalidArgumentError", "FattnUnsupportedError", "FattnOutOfMemoryError", "library_path",
           "built_with_cuda", "__version__", "F32", "F16", "BF16", "E4M3", "BACKEND_AUTO", "BACKEND_CPU",
           "BACKEND_CUDA", "OPTION_DISABLE_OVERLAP", "OPTION_DISABLE_PINGPONG", "OPTION_DISABLE_PDL",
           "OPTION_SOFTMAX_UNDER_PV", "OPTION_DISABLE_SPLIT"]

_E = _capi.ENUMS
F32 = _E["fattn_dtype"]["FATTN_DTYPE_F32"]
F16 = _E["fattn_dtype"]["FATTN_DTYPE_F16"]
BF16 = _E["fattn_dtype"]["FATTN_DTYPE_BF16"]
E4M3 = _E["fattn_dtype"]["FATTN_DTYPE_E4M3"]
OPTION_DISABLE_OVERLAP = _E["fattn_option"]["FATTN_OPTION_DISABLE_OVERLAP"]
OPTION_DISABLE_PINGPONG = _E["fattn_option"]["FATTN_OPTION_DISABLE_PINGPONG"]
OPTION_DISABLE_PDL = _E["fattn_option"]["FATTN_OPTION_DISABLE_PDL"]
OPTION_SOFTMAX_UNDER_PV = _E["fattn_option"]["FATTN_OPTION_SOFTMAX_UNDER_PV"]
OPTION_DISABLE_SPLIT = _E["fattn_option"]["FATTN_OPTION_DISABLE_SPLIT"]
BACKEND_AUTO = _E["fattn_backend"]["FATTN_BACKEND_AUTO"]
BACKEND_CPU = _E["fattn_backend"]["FATTN_BACKEND_CPU"]
BACKEND_CUDA = _E["fattn_backend"]["FATTN_BACKEND_CUDA"]

__version__ = _lib.fattn_version_string().decode()

try:  # written by the package's CMake build; absent in a source tree
    from ._build_config import WITH_CUDA as built_with_cuda  # noqa: F401
except ImportError:
    built_with_cuda = None

_torch_impl = None  # the torch integration, module ._torch, imported with torch


def _torch_module():
    global _torch_impl
    if _torch_impl is None:
        import importlib
        _torch_impl = importlib.import_module(__name__ + "._torch")
    return _torch_impl


class _AfterTorchImport:
    """A one-shot sys.meta_path entry: when torch is imported after fattn, the
    custom ops are registered right after torch's own import, because a first
    fattn call inside torch.compile cannot import a module (dynamo breaks the
    graph there).  Only the name "torch" is looked at; its spec comes from the
    other finders, unchanged but for a wrapped exec_module."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in _sys.meta_path:
            _sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_torch = spec.loader.exec_module

        def exec_module(module):
            exec_torch(module)
            try:
                _torch_module()
            except Exception:  # noqa: BLE001 - raised again, with its message, at the first torch call
                pass
        spec.loader.exec_module = exec_module
        return spec


# With torch imported, register the custom ops now; otherwise as soon as torch
# is imported.  Without torch nothing of it is imported (NumPy-only use).
if "torch" in _sys.modules:
    _torch_module()
else:
    _sys.meta_path.insert(0, _AfterTorchImport())


def _is_torch(x):
    if _torch_impl is not None:
        return isinstance(x, _torch_impl.torch.Tensor)
    t = _sys.modules.get("torch")  # a tensor exists only once torch is imported
    return t is not None and isinstance(x, t.Tensor)


def attention(q, k, v, causal=False, softmax_scale=None, fp8=None, return_lse=False, *, out=None, ctx=None,
              window_size=(-1, -1), softcap=0.0, learnable_sink=None):
    """softmax(q k^T * softmax_scale [+ causal mask]) v.

    q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv] (hq % hkv == 0):
    torch tensors (CUDA or CPU) or NumPy arrays (CPU), float32, float16 or
    bfloat16, one dtype.  Any strides; a layout fattn cannot read as it is
    (head dim not contiguous, expanded dimensions) is copied first; NumPy
    arrays in non-native byte order ('>f4') are converted first (an out= in
    that order is refused).

    Layout: [batch, seqlen, heads, head_dim], FlashAttention's, NOT
    torch.nn.functional.scaled_dot_product_attention's [batch, heads, seqlen,
    head_dim].  Both are 4-D, so a tensor in SDPA's layout cannot be told
    apart and is computed with heads and tokens swapped, silently: pass
    q.transpose(1, 2) (a view, no copy) and transpose the output back.
    causal: bottom-right aligned, as FlashAttention (rows that see no key give
    0 and lse -inf).  softmax_scale: None = 1/sqrt(d).
    fp8: None (or False) = off; True = quantise q, k, v to e4m3 first with one
    scale per 128 rows of each batch and head, no rotation (fattn_fwd_fp8);
    a fattn.FP8(granularity, block_q, block_k, block_v, rotate, seed) sets
    the scales and the Hadamard rotation of Q and K.  Forward only: inputs
    that require grad (with grad mode on) raise NotImplementedError (also a
    ValueError).
    Returns out [b, sq, hq, dv] in q's dtype, and with return_lse=True also
    lse [b, hq, sq] float32 (natural log; no gradient flows through it).
    out= writes into a given array; ctx= runs on a given Context (e.g. one
    with options set): both bypass autograd and torch.compile.
    The variants (fattn.h, FlashAttention's names): window_size=(left, right),
    query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right, -1
    unbounded ((-1, 0) is causal; with causal=True the masks intersect);
    softcap: scores s -> softcap * tanh(s / softcap), 0 = off; learnable_sink:
    [hq] of any float dtype (read as float32), one logit per query head in the
    softmax denominator only (FA4's; the returned lse includes it, a row that
    sees no key gives 0 and lse = the sink).  NumPy arrays (the CPU engine):
    forward, fp8 too.  Torch tensors (learnable_sink a torch tensor on q's
    device): forward and backward through autograd, with the gradient of
    learnable_sink (fattn_bwd's dsink) when it requires grad; fp8 forward only.
    The CPU engine serves every variant both ways; the CUDA engine's forward
    serves them (16-bit; FP8 the window only), its backward raises
    NotImplementedError with the library's message where it does not yet."""
    ws = _core.check_window_size("fattn.attention", window_size)
    softcap = 0.0 if softcap is None else softcap  # FA4's None: off
    if _is_torch(q):
        return _torch_module().attention(q, k, v, causal, softmax_scale, fp8, return_lse, out, ctx,
                                         window_size=ws, softcap=softcap, learnable_sink=learnable_sink)
    if _core.is_numpy(q):
        from . import _numpy
        return _numpy.attention(q, k, v, causal, softmax_scale, fp8, return_lse, out, ctx, ws, softcap,
                                learnable_sink)
    raise TypeError("fattn.attention takes torch tensors or NumPy arrays, got a %s" % type(q).__name__)


def _refuser(fn):
    """no(what): the NotImplementedError of an FA3 argument fattn cannot serve."""
    def no(what):
        raise NotImplementedError("%s: %s is not supported by fattn" % (fn, what))
    return no


def _fa_window(fn, window_size):
    """FlashAttention's window_size as fattn's: None (no window) or (left, right) with
    -1 unbounded.  FA3's (-1, -1) default, any negative side (FA3 reads < 0 as
    unbounded) and FA4's None (its (None, None) default) are unbounded."""
    ws = tuple(window_size) if window_size is not None else (-1, -1)
    if len(ws) != 2:
        raise ValueError("%s: window_size must be a pair (left, right), got %r" % (fn, window_size))
    out = []
    for x in ws:
        if x is None:
            out.append(-1)
        elif isinstance(x, bool) or not hasattr(x, "__index__"):
            raise ValueError("%s: window_size must be a pair of ints (or None), got %r" % (fn, window_size))
        else:
            out.append(max(int(x), -1))
    return None if out == [-1, -1] else tuple(out)


def _fa_common_args(fn, no, causal, descales, descale_note, window_size, attention_chunk, softcap, num_splits,
                    splits_note, sm_margin):
    """The FlashAttention-3 arguments flash_attn_func, flash_attn_varlen_func and
    flash_attn_with_kvcache share: refused through no() where fattn cannot give their
    effect; returns (causal, window_size for fattn or None, softcap, attention_chunk)."""
    if any(x is not None for x in descales):
        no("q_descale/k_descale/v_descale" + descale_note)
    ws = _fa_window(fn, window_size)
    if ws is not None and ws[0] < 0 and ws[1] == 0:
        causal, ws = True, None  # FlashAttention's causal mask is the window (-inf, 0], bottom-right aligned
    chunk = 0 if attention_chunk is None else attention_chunk
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise ValueError("%s: attention_chunk must be an int >= 0 (0: off), got %r" % (fn, attention_chunk))
    # num_splits, as pack_gqa, only steers FA3's schedule (the same values up to rounding): a hint
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0):
        raise ValueError("%s: num_splits must be an int >= 0, got %r" % (fn, num_splits))
    if sm_margin:
        no("sm_margin=%r" % (sm_margin,))
    return causal, ws, 0.0 if softcap is None else softcap, chunk


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, learnable_sink=None):
    """FlashAttention-3's flash_attn_func (flash_attn_interface), served by fattn:
    FA3's argument order (4th positional softmax_scale; FA2's is dropout_p: fattn.compat.flash_attn).
    `from fattn import flash_attn_func` switches an FA3 caller.  Tensors are
    [b, s, h, d] torch tensors.  Arguments whose effect fattn cannot give raise
    NotImplementedError, never ignored: qv, q/k/v_descale without
    float8_e4m3fn inputs, sm_margin != 0.  attention_chunk (FA3's chunked
    attention, within causal and the window): the same call on a finer
    varlen batch (_chunk.py), forward and backward.
    float8_e4m3fn q, k, v take FA3's q/k/v_descale (float32 [b, hkv], None = 1) and
    return bf16, forward only, as FA3's FP8 kernel.  window_size
    (FA3's: (-1, -1) none, a negative side unbounded, (-1, 0) causal; FA4's
    None for a side is -1 too), softcap (0 or None off) and learnable_sink
    (FA4's: [hq], any float dtype) are fattn.attention's, with their
    gradients.  num_splits (any) and
    pack_gqa are scheduling hints with no numerical effect: fattn schedules
    itself.  deterministic is passed to the backward.  Returns out, or
    (out, softmax_lse [b, h, sq] float32) with return_attn_probs=True."""
    no = _refuser("fattn.flash_attn_func")
    if qv is not None:
        no("qv")
    e4m3 = _is_torch(q) and str(q.dtype) == "torch.float8_e4m3fn"
    causal, ws, softcap, chunk = _fa_common_args("fattn.flash_attn_func", no, causal,
                                                 () if e4m3 else (q_descale, k_descale, v_descale),
                                                 " (they go with float8_e4m3fn q, k, v)", window_size,
                                                 attention_chunk, softcap, num_splits, "", sm_margin)
    if not _is_torch(q):
        raise TypeError("fattn.flash_attn_func takes torch tensors, got a %s (fattn.attention also takes "
                        "NumPy arrays)" % type(q).__name__)
    t = _torch_module()
    if e4m3:  # FA3's FP8 call: e4m3 q, k, v with float32 [b, hkv] descales, bf16 out, forward only
        if softcap:
            no("softcap with float8_e4m3fn inputs")
        if learnable_sink is not None:
            no("learnable_sink with float8_e4m3fn inputs")
        if chunk:
            no("attention_chunk with float8_e4m3fn inputs")
        o_lse = t.attention_e4m3(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, ws)
        return o_lse if return_attn_probs else o_lse[0]
    if chunk:  # as a varlen batch of equal lengths, split by chunk (_chunk.py)
        import torch
        from . import _chunk
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError("fattn.flash_attn_func: q, k, v must be 4-D [batch, seqlen, heads, head_dim]")
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        ar = lambda n: torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=q.device)  # noqa: E731
        cu_q, cu_k, _, _, mk = _chunk.varlen_split(ar(sq), ar(sk), None, None, sk, chunk)
        o, lse = t.varlen(q.reshape(b * sq, *q.shape[2:]), k.reshape(b * sk, *k.shape[2:]),
                          v.reshape(b * sk, *v.shape[2:]), cu_q, cu_k, None, sq, mk, softmax_scale, causal,
                          deterministic, ws, softcap, learnable_sink, None)
        o_lse = (o.view(b, sq, *o.shape[1:]), lse.view(lse.shape[0], b, sq).permute(1, 0, 2))
        return o_lse if return_attn_probs else o_lse[0]
    o_lse = t.attention(q, k, v, causal, softmax_scale, None, True, None, None, deterministic=deterministic,
                        window_size=ws, softcap=softcap, learnable_sink=learnable_sink)
    return o_lse if return_attn_probs else o_lse[0]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False,
                           learnable_sink=None):
    """FlashAttention-3's flash_attn_varlen_func (flash_attn_interface), served by
    fattn_fwd with cu_seqlens: a batch of sequences of different lengths packed
    without padding.  Torch tensors only (CUDA or CPU), as FA3's: NumPy arrays
    go through fattn.attention, which has no variable-length form.

    q [total_q, hq, d], k [total_k, hkv, d], v [total_k, hkv, dv] (hq % hkv ==
    0); cu_seqlens_q, cu_seqlens_k contiguous int32 tensors [batch + 1] on q's
    device (non-decreasing from 0: sequence b is rows cu_seqlens_q[b] ..
    cu_seqlens_q[b + 1] - 1 of q and o, and likewise of k, v; an empty
    sequence is allowed); max_seqlen_q, max_seqlen_k ints >= every sequence's
    length.  The entries of cu_seqlens are never copied to the host here (no
    synchronisation: the call can be captured in a CUDA graph); the CPU engine
    checks them (FattnInvalidArgumentError, a ValueError, nothing written).
    causal: bottom-right aligned per sequence, as FlashAttention's (key j seen
    by query i iff j <= i + len_k - len_q; a row that sees no key gives 0 and
    lse -inf).  seqused_k (int32 [batch], optional): sequence b uses its first
    seqused_k[b] keys only; both engines serve it, forward and backward (the
    CUDA engine's variable-length kernels; fattn.h says which unused rows
    must be finite there), the gradients of the unused keys' k and v rows
    being 0.  Returns out [total_q,
    hq, dv], or (out, softmax_lse [hq, total_q] float32) with
    return_attn_probs=True.  Differentiable (torch.ops.fattn.fwd_varlen, with
    fattn_bwd on the same cu_seqlens); deterministic is passed to the backward.

    window_size, softcap and learnable_sink as flash_attn_func's, per sequence
    (the window bottom-right aligned on its own lengths; d(learnable_sink)
    sums every sequence's rows).  seqused_q (int32 [batch], optional):
    sequence b computes its first seqused_q[b] queries, the rows of out and
    lse past them are left unwritten (FA3's: nothing is promised there) and
    their q rows get a zero gradient.  Arguments whose effect fattn cannot give
    raise NotImplementedError, never ignored: qv, q/k/v_descale,
    sm_margin != 0 (attention_chunk: flash_attn_func's).  num_splits and pack_gqa are
    scheduling hints: fattn schedules itself.  Shapes that do not fit,
    cu_seqlens of another dtype, layout, length or device raise ValueError
    (TypeError for a non-tensor)."""
    no = _refuser("fattn.flash_attn_varlen_func")
    if qv is not None:
        no("qv")
    causal, ws, softcap, chunk = _fa_common_args("fattn.flash_attn_varlen_func", no, causal,
                                                 (q_descale, k_descale, v_descale), " (fp8 inputs)", window_size,
                                                 attention_chunk, softcap, num_splits, "", sm_margin)
    if not _is_torch(q):
        raise TypeError("fattn.flash_attn_varlen_func takes torch tensors, got a %s" % type(q).__name__)
    if chunk:  # the same call on a finer varlen batch (_chunk.py)
        from . import _chunk
        for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if not _is_torch(x) or x.dim() != 1 or x.shape[0] < 1:
                raise ValueError("fattn.flash_attn_varlen_func: %s must be an int32 tensor [batch + 1]" % name)
        cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_k = _chunk.varlen_split(
            cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_k, chunk)
    o_lse = _torch_module().varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                   softmax_scale, causal, deterministic, ws, softcap, learnable_sink, seqused_q)
    return o_lse if return_attn_probs else o_lse[0]


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False, learnable_sink=None, k_scale=None, v_scale=None):
    """FlashAttention-3's flash_attn_with_kvcache (flash_attn_interface), the
    decoding step, served by fattn: fattn_kv_append, then fattn_fwd with
    seqused_k (and block_table for a paged cache).  Torch tensors (CUDA or CPU).

    q [b, sq, hq, d]; k_cache, v_cache [b, capacity, hkv, d (dv)], or with
    page_table (int32 [b, max_pages]) page pools [num_pages, page_size, hkv,
    d (dv)]; cache_seqlens an int32 tensor [b] or an int (None: every key of
    the cache is used).  k, v [b, s_new, hkv, d] (optional, need
    cache_seqlens): written in place into the caches at rows cache_seqlens[i]
    .. + s_new - 1 of each sequence (nothing else of the caches is written),
    then attention uses cache_seqlens + s_new keys per sequence; cache_seqlens
    itself is not advanced (the caller does).  causal: bottom-right aligned
    on each sequence's used keys.  Returns out [b, sq, hq, dv], or (out,
    softmax_lse [b, hq, sq] float32) with return_softmax_lse (FA3's own code
    appends its two split accumulators after these: `out, lse, *_ = ...`
    reads both).

    Arguments fattn cannot serve raise NotImplementedError, never ignored:
    qv, rotary_cos/rotary_sin, float8_e4m3fn q (FA3's FP8 call),
    q/k/v_descale, scheduler_metadata, sm_margin != 0,
    and appending k, v [b, s_new, ...] of head_dim_v != head_dim to a cache
    without cu_seqlens.  rotary_seqlens and rotary_interleaved are ignored
    without rotary_cos, as FA3 ignores them.  cu_seqlens_q (int32 [b + 1])
    with max_seqlen_q: q packed [total_q, hq, d], a varlen batch of new
    queries on the cache (chunked prefill; vLLM's call), each sequence over
    its first cache_seqlens[b] keys (plus its new rows); out [total_q, hq,
    dv], softmax_lse [hq, total_q]; a 16-bit cache (an FP8 one:
    NotImplementedError).  cu_seqlens_k_new (int32 [b + 1]): k, v packed
    [total_new, hkv, d (dv)], sequence b's new rows cu_seqlens_k_new[b] ..
    [b + 1] - 1.  New rows beside cu_seqlens_q or packed by cu_seqlens_k_new
    are written by torch indexing (fattn_kv_append takes neither; on CUDA
    this costs a host synchronisation, so such a call is not for CUDA
    graphs), then attended with cache_seqlens + each sequence's count; a
    16-bit cache.  cache_batch_idx (int32 [b]): sequence b reads entry
    cache_batch_idx[b] of a contiguous cache (appends go there too), or row
    cache_batch_idx[b] of page_table; cache_leftpad (int32 [b]): its keys
    start at that row (fattn.h).  Both engines, with cu_seqlens_q too; on
    CUDA through the varlen kernels (a contiguous cache for the left pad).
    window_size, softcap and learnable_sink (FA4's name, after FA3's
    arguments) as flash_attn_func's, the window bottom-right aligned on each
    sequence's used keys.  Accepted: num_splits 0 or > 1 (fattn's schedule)
    and 1 (no split of the keys: FATTN_OPTION_DISABLE_SPLIT for this call;
    the same values up to rounding), pack_gqa (a scheduling hint: fattn
    packs the GQA group itself), max_seqlen_q (needed with cu_seqlens_q,
    unused without).  Forward only (FA3's has no backward): tensors that
    require grad with grad mode on raise NotImplementedError.  The CUDA
    engine serves caches with cache_seqlens or page_table by its decoding
    kernel (fattn.h: 16-bit, head dims 64/128/256, sq <= 16 and sq * hq /
    hkv <= 64, 32 at d 256, page_size a power of two >= 8) and, past those
    shapes or page sizes, by its varlen kernels (any page_size).  Others raise
    FattnUnsupportedError, after the append when k, v are given (the rows
    are then written past cache_seqlens, where the next append writes them
    again).

    An FP8 KV cache (fattn.h 0.5; vLLM's and FlashInfer's k_scale / v_scale
    names, after FA3's arguments): k_cache and v_cache torch.float8_e4m3fn
    with q float16, bfloat16 or float32, and k_scale, v_scale contiguous
    float32 tensors on q's device, each [num_pages, hkv] (one scale per page
    and kv head) or [num_pages, hkv, page_size] (one per token and kv head);
    a contiguous cache [b, hkv] or [b, hkv, capacity].  Key j's values are
    its codes times its scale.  k, v (q's dtype) are quantised as they are
    appended and their scales written in place (fattn.h, fattn_kv_append:
    a page's scale is set by the append that writes its first row, later
    rows keep it and saturate at 448 x scale; per-token scales never
    saturate).  CPU tensors: any shape; CUDA: the decoding kernel's shapes
    (q float16 / bfloat16, sq * hq / hkv <= 64, 16 at d 256), others raise
    FattnUnsupportedError.  k_scale / v_scale without an e4m3 cache, or an
    e4m3 cache without them: ValueError."""
    no = _refuser("fattn.flash_attn_with_kvcache")
    # rotary_seqlens and rotary_interleaved only steer the rotary embedding of rotary_cos/rotary_sin: FA3
    # ignores them without it (its own test passes rotary_seqlens=cache_seqlens either way)
    for name, val in (("qv", qv), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                      ("scheduler_metadata", scheduler_metadata)):
        if val is not None:
            no(name)
    if _is_torch(q) and str(q.dtype) == "torch.float8_e4m3fn":
        no("float8_e4m3fn q (FA3's FP8 decoding: e4m3 q, k, v and caches with q/k/v_descale; fattn's FP8 KV "
           "cache takes float16/bfloat16/float32 q with k_scale, v_scale, and the CUDA decoding and varlen kernels "
           "have no e4m3-q instance on a cache)")
    causal, ws, softcap, chunk = _fa_common_args("fattn.flash_attn_with_kvcache", no, causal,
                                                 (q_descale, k_descale, v_descale), " (fp8 inputs)", window_size,
                                                 attention_chunk, softcap, num_splits, "; 0 or 1 = none are served",
                                                 sm_margin)
    if not _is_torch(q):
        raise TypeError("fattn.flash_attn_with_kvcache takes torch tensors, got a %s" % type(q).__name__)
    out, lse = _torch_module().kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale, causal,
                                       num_splits == 1, ws, softcap, learnable_sink, k_scale, v_scale, cu_seqlens_q,
                                       max_seqlen_q, cache_batch_idx, cache_leftpad, cu_seqlens_k_new, chunk)
    return (out, lse) if return_softmax_lse else out
