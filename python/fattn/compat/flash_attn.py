"""fattn.compat.flash_attn - FlashAttention-2's `flash_attn.flash_attn_interface`, served
by fattn: FA2 callers switch by import.

    from fattn.compat.flash_attn import flash_attn_func
    o = flash_attn_func(q, k, v, 0.0, None, True)        # FA2 order: dropout_p, softmax_scale, causal

The public functions keep FA2's signatures and defaults (FA2's 4th positional
argument is dropout_p; fattn.flash_attn_func follows FA3, whose 4th is
softmax_scale).  The private ones are the entry points ring-flash-attn and
yunchang call for each block of a ring (field notes §3): the forward returns
(out, softmax_lse, S_dmask, rng_state), the backward takes an outside O and LSE
(the merged ones) and writes into the given dq, dk, dv.  LSE: float32, natural
log, [b, h, s] dense and [h, total_q] packed (FA >= 2.6).

Refused with NotImplementedError (a message, never ignored): dropout_p != 0
(fattn has no attention dropout), alibi_slopes, return_softmax / returned
probabilities, and what fattn's own functions refuse (window_size, softcap on the
torch path: see fattn.flash_attn_func).
"""
import math

import torch

import fattn as _fattn
from .. import parallel as _par

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "_flash_attn_forward",
           "_flash_attn_backward", "_flash_attn_varlen_forward", "_flash_attn_varlen_backward"]


def _no(fn, what):
    raise NotImplementedError("fattn.compat.flash_attn.%s: %s" % (fn, what))


def _check_dropout(fn, dropout_p):
    if dropout_p:
        _no(fn, "dropout_p=%r: fattn has no attention dropout; pass dropout_p=0.0 (as FA2 itself asks for "
                "evaluation), or keep FlashAttention-2 for training with attention dropout" % (dropout_p,))


def _check_alibi(fn, alibi_slopes):
    if alibi_slopes is not None:
        _no(fn, "alibi_slopes: fattn has no ALiBi bias")


def _check_block_args(fn, dropout_p, window_size_left, window_size_right, softcap, alibi_slopes, return_softmax=False):
    """The arguments of a private FA2 entry point fattn serves; returns whether the
    window makes the call causal ((-1, 0) is FA's causal mask)."""
    _check_dropout(fn, dropout_p)
    _check_alibi(fn, alibi_slopes)
    if return_softmax:
        _no(fn, "return_softmax=True: fattn does not materialise the attention probabilities")
    if softcap:
        _no(fn, "softcap=%r (the backward through softcap is not on fattn's torch path yet)" % (softcap,))
    wl = -1 if window_size_left is None else window_size_left
    wr = -1 if window_size_right is None else window_size_right
    if wl < 0 and wr == 0:
        return True
    if not (wl < 0 and wr < 0):
        _no(fn, "window_size=(%r, %r) (local attention; the backward through a window is not on fattn's torch "
                "path yet)" % (window_size_left, window_size_right))
    return False


def _scale(softmax_scale, q):
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _softmax_d(dout, out, dense):
    """D = rowsum(dout * out) in float32, [b, h, s] (dense) or [h, total] (packed): the
    softmax_d FA2's backward returns (unpadded here)."""
    d = (dout.float() * out.float()).sum(-1)
    return d.transpose(1, 2).contiguous() if dense else d.transpose(0, 1).contiguous()


def _write(dst, src):
    if dst is not None:
        dst.copy_(src)


# ---------------------------------------------------------------------------
# The private API (flash_attn 2.6 - 2.8's parameter names and order)
# ---------------------------------------------------------------------------

def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                        alibi_slopes, return_softmax):
    """FA2's _flash_attn_forward: q [b, sq, hq, d], k, v [b, sk, hkv, d] ->
    (out [b, sq, hq, d], softmax_lse [b, hq, sq] float32, S_dmask (empty), rng_state
    (int64 [2], zeros: no dropout))."""
    causal = _check_block_args("_flash_attn_forward", dropout_p, window_size_left, window_size_right, softcap,
                               alibi_slopes, return_softmax) or bool(causal)
    with torch.no_grad():
        out, lse = _par.block_forward(q, k, v, causal, _scale(softmax_scale, q))
    return out, lse, q.new_empty((0,)), torch.zeros(2, dtype=torch.int64, device=q.device)


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False):
    """FA2's _flash_attn_varlen_forward: packed q [total_q, hq, d], k, v [total_k, hkv, d]
    with int32 cu_seqlens -> (out [total_q, hq, d], softmax_lse [hq, total_q] float32,
    S_dmask (empty), rng_state).  block_table and leftpad_k are refused; seqused_k is
    served (forward)."""
    fn = "_flash_attn_varlen_forward"
    causal = _check_block_args(fn, dropout_p, window_size_left, window_size_right, softcap, alibi_slopes,
                               return_softmax) or bool(causal)
    if block_table is not None:
        _no(fn, "block_table (a paged cache: fattn.flash_attn_with_kvcache serves one)")
    if leftpad_k is not None:
        _no(fn, "leftpad_k")
    ops = _fattn._torch_module()
    with torch.no_grad():
        out, lse = ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
                                  int(max_seqlen_k), causal, _scale(softmax_scale, q), False)
    return out, lse, q.new_empty((0,)), torch.zeros(2, dtype=torch.int64, device=q.device)


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    """FA2's _flash_attn_backward: writes dq, dk, dv (given tensors, shaped like q, k,
    v; None skips one) from dout and an outside out and softmax_lse [b, hq, sq] (for
    ring attention: the merged O, cast to q's dtype, and the global LSE).  Returns
    softmax_d = rowsum(dout * out) float32 [b, hq, sq]."""
    causal = _check_block_args("_flash_attn_backward", dropout_p, window_size_left, window_size_right, softcap,
                               alibi_slopes) or bool(causal)
    with torch.no_grad():
        g = _par.block_backward(dout, q, k, v, out, softmax_lse, causal, _scale(softmax_scale, q),
                                bool(deterministic))
        for dst, src in zip((dq, dk, dv), g):
            _write(dst, src)
        return _softmax_d(dout, out, True)


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
                                window_size_right, softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False):
    """FA2's _flash_attn_varlen_backward: as _flash_attn_backward on packed tensors,
    softmax_lse [hq, total_q]; returns softmax_d [hq, total_q] float32."""
    causal = _check_block_args("_flash_attn_varlen_backward", dropout_p, window_size_left, window_size_right,
                               softcap, alibi_slopes) or bool(causal)
    with torch.no_grad():
        g = _par.block_backward(dout, q, k, v, out, softmax_lse, causal, _scale(softmax_scale, q),
                                bool(deterministic), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        for dst, src in zip((dq, dk, dv), g):
            _write(dst, src)
        return _softmax_d(dout, out, False)


# ---------------------------------------------------------------------------
# The public API (flash_attn 2.x's signatures and defaults)
# ---------------------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention-2's flash_attn_func, served by fattn.flash_attn_func (differentiable).
    q [b, sq, hq, d], k, v [b, sk, hkv, d].  dropout_p must be 0 and alibi_slopes None
    (NotImplementedError otherwise).  Returns out, or with return_attn_probs=True
    (out, softmax_lse [b, hq, sq], None): fattn keeps no probabilities, so FA2's
    S_dmask is None."""
    _check_dropout("flash_attn_func", dropout_p)
    _check_alibi("flash_attn_func", alibi_slopes)
    r = _fattn.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                               softcap=softcap, deterministic=deterministic, return_attn_probs=return_attn_probs)
    return (r[0], r[1], None) if return_attn_probs else r


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """FlashAttention-2's flash_attn_varlen_func, served by fattn.flash_attn_varlen_func
    (differentiable).  dropout_p must be 0, alibi_slopes and block_table None.  Returns
    out, or (out, softmax_lse [hq, total_q], None) with return_attn_probs=True."""
    _check_dropout("flash_attn_varlen_func", dropout_p)
    _check_alibi("flash_attn_varlen_func", alibi_slopes)
    if block_table is not None:
        _no("flash_attn_varlen_func", "block_table (a paged cache: flash_attn_with_kvcache serves one)")
    r = _fattn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                      softcap=softcap, deterministic=deterministic,
                                      return_attn_probs=return_attn_probs)
    return (r[0], r[1], None) if return_attn_probs else r


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """FlashAttention-2's flash_attn_with_kvcache (decoding; forward only), served by
    fattn.flash_attn_with_kvcache: block_table is FA3's page_table.  alibi_slopes is
    refused; rotary embeddings, cache_batch_idx and cache_leftpad are refused there."""
    _check_alibi("flash_attn_with_kvcache", alibi_slopes)
    return _fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                          cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
                                          cache_leftpad=cache_leftpad, page_table=block_table,
                                          softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                          softcap=softcap, rotary_interleaved=rotary_interleaved,
                                          num_splits=num_splits, return_softmax_lse=return_softmax_lse)
