"""fattn.compat.flash_attn_interface - FlashAttention-3's top-level `flash_attn_interface`
(hopper/flash_attn_interface.py), served by fattn.

    _flash_attn_forward(q, k, v, k_new, v_new, qv, out_, cu_seqlens_q, cu_seqlens_k,
        cu_seqlens_k_new, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, page_table,
        kv_batch_idx, leftpad_k, rotary_cos, rotary_sin, seqlens_rotary, q_descale,
        k_descale, v_descale, softmax_scale, causal, window_size_left, window_size_right,
        attention_chunk, softcap, rotary_interleaved, scheduler_metadata, num_splits,
        pack_gqa, sm_margin) -> (out, softmax_lse, out_accum, softmax_lse_accum)
    _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
        sequed_q, sequed_k, max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale,
        is_causal, window_size_left, window_size_right, softcap, deterministic,
        sm_margin) -> softmax_d

FA3's parameter names and order (TransformerEngine calls them positionally, yunchang
by keyword), its spelling `sequed_q`/`sequed_k` included.  One function serves dense
and packed calls (cu_seqlens given).  The forward returns FA3's 4-tuple (the two split
accumulators empty); the backward takes an outside O and LSE and writes the given dq,
dk, dv.  flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache are
fattn's own (FA3's signatures).  Arguments fattn cannot serve raise NotImplementedError:
k_new/v_new, qv, cu_seqlens_k_new, seqused_q, page_table, kv_batch_idx, leftpad_k,
rotary embeddings, q/k/v_descale, attention_chunk, softcap, windows other than (-1, -1)
and (-1, 0), scheduler_metadata; num_splits, pack_gqa and sm_margin are scheduling hints.
"""
import math

import torch

import fattn as _fattn
from fattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401
from .. import parallel as _par

__all__ = ["_flash_attn_forward", "_flash_attn_backward", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache"]


def _no(fn, what):
    raise NotImplementedError("fattn.compat.flash_attn_interface.%s: %s is not supported by fattn" % (fn, what))


def _window_causal(fn, causal, window_size_left, window_size_right):
    wl = -1 if window_size_left is None else window_size_left
    wr = -1 if window_size_right is None else window_size_right
    if wl < 0 and wr == 0:
        return True
    if not (wl < 0 and wr < 0):
        _no(fn, "window_size=(%r, %r) (local attention)" % (window_size_left, window_size_right))
    return bool(causal)


def _varlen_args(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        _no(fn, "cu_seqlens_q without cu_seqlens_k (or the reverse)")
    if cu_seqlens_q is not None and (max_seqlen_q is None or max_seqlen_k is None):
        raise ValueError("fattn.compat.flash_attn_interface.%s: cu_seqlens need max_seqlen_q and max_seqlen_k" % fn)
    return cu_seqlens_q is not None


def _scale(softmax_scale, q):
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None, cu_seqlens_q=None, cu_seqlens_k=None,
                        cu_seqlens_k_new=None, seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
                        page_table=None, kv_batch_idx=None, leftpad_k=None, rotary_cos=None, rotary_sin=None,
                        seqlens_rotary=None, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                        causal=False, window_size_left=-1, window_size_right=-1, attention_chunk=0, softcap=0.0,
                        rotary_interleaved=True, scheduler_metadata=None, num_splits=1, pack_gqa=None,
                        sm_margin=0):
    """FA3's _flash_attn_forward: dense q [b, sq, hq, d] (softmax_lse [b, hq, sq]) or,
    with cu_seqlens_q/k, packed q [total_q, hq, d] (softmax_lse [hq, total_q]); seqused_k
    (packed calls) served.  out_: written with the result when given.  Returns (out,
    softmax_lse float32, out_accum, softmax_lse_accum), the last two empty."""
    fn = "_flash_attn_forward"
    for name, val in (("k_new", k_new), ("v_new", v_new), ("qv", qv), ("cu_seqlens_k_new", cu_seqlens_k_new),
                      ("seqused_q", seqused_q), ("page_table", page_table), ("kv_batch_idx", kv_batch_idx),
                      ("leftpad_k", leftpad_k), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                      ("seqlens_rotary", seqlens_rotary), ("q_descale", q_descale), ("k_descale", k_descale),
                      ("v_descale", v_descale), ("scheduler_metadata", scheduler_metadata)):
        if val is not None:
            _no(fn, name)
    if attention_chunk:
        _no(fn, "attention_chunk=%r" % (attention_chunk,))
    if softcap:
        _no(fn, "softcap=%r (with a backward)" % (softcap,))
    causal = _window_causal(fn, causal, window_size_left, window_size_right)
    varlen = _varlen_args(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = _scale(softmax_scale, q)
    with torch.no_grad():
        if varlen:
            out, lse = _fattn._torch_module().fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                         int(max_seqlen_q), int(max_seqlen_k), causal, scale, False)
        else:
            if seqused_k is not None:
                _no(fn, "seqused_k on a dense (non-varlen) call")
            out, lse = _par.block_forward(q, k, v, causal, scale)
        if out_ is not None:
            out_.copy_(out)
            out = out_
    empty = torch.empty(0, device=q.device)
    return out, lse, empty, empty.clone()


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None, sequed_q=None,
                         sequed_k=None, max_seqlen_q=None, max_seqlen_k=None, dq=None, dk=None, dv=None,
                         softmax_scale=None, is_causal=False, window_size_left=-1, window_size_right=-1, softcap=0.0,
                         deterministic=False, sm_margin=0):
    """FA3's _flash_attn_backward: writes dq, dk, dv (given, shaped like q, k, v; None
    skips one) from dout and an outside out and softmax_lse (dense [b, hq, sq], packed
    [hq, total_q]).  Returns softmax_d = rowsum(dout * out) float32, shaped like
    softmax_lse (FA3 pads it; its callers do not read it)."""
    fn = "_flash_attn_backward"
    if sequed_q is not None or sequed_k is not None:
        _no(fn, "sequed_q/sequed_k (fattn_bwd has no seqused)")
    if softcap:
        _no(fn, "softcap=%r" % (softcap,))
    causal = _window_causal(fn, is_causal, window_size_left, window_size_right)
    varlen = _varlen_args(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    with torch.no_grad():
        extra = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) if varlen else ()
        g = _par.block_backward(dout, q, k, v, out, softmax_lse, causal, _scale(softmax_scale, q),
                                bool(deterministic), *extra)
        for dst, src in zip((dq, dk, dv), g):
            if dst is not None:
                dst.copy_(src)
        d = (dout.float() * out.float()).sum(-1)
        return d.transpose(0, 1).contiguous() if varlen else d.transpose(1, 2).contiguous()
