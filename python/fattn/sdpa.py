"""sdpa.py - fattn behind torch.nn.functional.scaled_dot_product_attention.

    import fattn.sdpa
    fattn.sdpa.enable()       # torch >= 2.9: fattn becomes torch's flash-attention implementation
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # CUDA tensors: fattn's kernels
    fattn.sdpa.disable()      # torch's own flash attention again

Through torch's own registry (torch.nn.attention.register_flash_attention_impl /
activate_flash_attention_impl, as FlashAttention-3 and -4 register): the CUDA kernels
of aten's flash-attention ops (_scaled_dot_product_flash_attention and
_flash_attention_forward, their backwards, and _flash_attention_forward_no_dropout_inplace)
become fattn's, so SDPA's flash backend, torch.nn.attention.varlen.varlen_attn and
context_parallel (which intercepts those ops) run fattn.  SDPA still picks its
backend first (flash for 16-bit CUDA inputs it accepts).  Inputs fattn cannot serve
(a GPU older than sm_80, head dims other than 64/96/128/192/256 and 192/128 on Hopper and 64/96/128/192/256
on the portable engine of other GPUs, a variant's backward on that engine, a sliding window with a backward, ...) are computed by a plain float32 torch composite (matmul and softmax,
O(s^2) memory) instead: torch's original flash kernel is shadowed by the registration
and cannot be called.  dropout_p != 0, alibi_slopes, block_table and
return_debug_mask raise NotImplementedError (disable() gives torch's kernel back).
Causal masks are FlashAttention's (bottom-right aligned), as torch's flash ops.
"""
import math
import warnings

import torch

from . import _core

NAME = "FATTN"

__all__ = ["NAME", "enable", "disable", "register", "is_enabled"]


def _registry():
    import torch.nn.attention as att
    fns = ("register_flash_attention_impl", "activate_flash_attention_impl", "restore_flash_attention_impl",
           "current_flash_attention_impl")
    if not all(hasattr(att, f) for f in fns):
        raise RuntimeError("fattn.sdpa: this torch (%s) has no flash-attention registry "
                           "(torch.nn.attention.register_flash_attention_impl, torch >= 2.9): SDPA cannot be "
                           "pointed at fattn; call fattn.attention or fattn.flash_attn_func directly"
                           % torch.__version__)
    return att


def register():
    """Register fattn under the name "FATTN" in torch's flash-attention registry (not
    activated: torch.nn.attention.activate_flash_attention_impl("FATTN") or enable()
    does that).  RuntimeError on torch without the registry."""
    att = _registry()
    att.register_flash_attention_impl(NAME, register_fn=_register_kernels)


def enable():
    """Register and activate fattn as torch's flash-attention implementation."""
    att = _registry()
    register()
    att.activate_flash_attention_impl(NAME)


def disable():
    """Give torch's own flash attention back (when fattn's is the active one)."""
    att = _registry()
    if att.current_flash_attention_impl() == NAME:
        att.restore_flash_attention_impl()


def is_enabled():
    try:
        return _registry().current_flash_attention_impl() == NAME
    except RuntimeError:
        return False


class _Handle:
    def __init__(self, lib):
        self.library = lib

    def remove(self):
        lib, self.library = self.library, None
        if lib is not None and hasattr(lib, "_destroy"):
            lib._destroy()


def _register_kernels():
    from torch.library import Library
    lib = Library("aten", "IMPL", "CUDA")
    impls = (("_scaled_dot_product_flash_attention", sdpa_flash_forward),
             ("_scaled_dot_product_flash_attention_backward", sdpa_flash_backward),
             ("_flash_attention_forward", flash_forward),
             ("_flash_attention_backward", flash_backward),
             ("_flash_attention_forward_no_dropout_inplace", flash_forward_no_dropout_inplace))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        for op, fn in impls:
            if hasattr(torch.ops.aten, op):
                lib.impl(op, fn, "CUDA")
    return _Handle(lib)


# ---------------------------------------------------------------------------
# The kernels (also callable on CPU tensors: the CPU engine serves them)
# ---------------------------------------------------------------------------

def _ops():
    from . import _torch_module
    return _torch_module()


def _no(what):
    raise NotImplementedError("fattn SDPA (fattn.sdpa.enable()): %s is not supported by fattn; call "
                              "fattn.sdpa.disable() to use torch's own flash attention" % what)


def _window(wl, wr, causal):
    """(causal, wl, wr) with FlashAttention's causal window (-1, 0) as causal=True and
    no window, so that it runs on fattn's causal kernels (varlen_attn passes it so)."""
    wl = -1 if wl is None else int(wl)
    wr = -1 if wr is None else int(wr)
    if wl < 0 and wr == 0:
        return True, -1, -1
    return bool(causal), wl, wr


def _fallback(exc):
    """Whether fattn refused the inputs as unsupported (then the composite serves them)."""
    return isinstance(exc, (_core.FattnUnsupportedError, NotImplementedError))


def _mask(sq, sk, causal, wl, wr, device):
    """FlashAttention's mask (True = hidden): bottom-right causal and window."""
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    hide = torch.zeros(sq, sk, dtype=torch.bool, device=device)
    if causal:
        hide |= j > i
    if wr >= 0:
        hide |= j > i + wr
    if wl >= 0:
        hide |= j < i - wl
    return hide


def _scores(q, k, causal, scale, wl, wr):
    g = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float().repeat_interleave(g, 2)) * scale
    return s.masked_fill(_mask(q.shape[1], k.shape[1], causal, wl, wr, q.device), -math.inf)


def composite_forward(q, k, v, causal, scale, wl=-1, wr=-1):
    """Attention in float32 torch ops on [b, s, h, d] (GQA): (out in q's dtype, lse
    [b, hq, sq]); a row that sees no key gives 0 and lse -inf."""
    s = _scores(q, k, causal, scale, wl, wr)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    g = q.shape[2] // k.shape[2]
    o = torch.einsum("bhqk,bkhd->bqhd", p, v.float().repeat_interleave(g, 2))
    return o.to(q.dtype), lse


def composite_backward(dout, q, k, v, out, lse, causal, scale, wl=-1, wr=-1):
    """(dq, dk, dv) of composite_forward from an outside out and lse, in float32 ops."""
    b, sk, hkv = k.shape[0], k.shape[1], k.shape[2]
    g = q.shape[2] // hkv
    s = _scores(q, k, causal, scale, wl, wr)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num_(0.0)
    do = dout.float()
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, v.float().repeat_interleave(g, 2))
    dsum = (do * out.float()).sum(-1).transpose(1, 2)
    ds = p * (dp - dsum.unsqueeze(-1))
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k.float().repeat_interleave(g, 2)) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.float()) * scale

    def heads(x):
        return x.view(b, sk, hkv, g, x.shape[-1]).sum(3)
    return dq.to(q.dtype), heads(dk).to(k.dtype), heads(dv).to(v.dtype)


def _per_sequence(fn, cu_q, cu_k, *packed):
    """fn on each sequence of packed [t, h, d] tensors (as batch 1): the composite's varlen."""
    outs = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        args = []
        for kind, t in packed:
            a, z = (cq[i], cq[i + 1]) if kind == "q" else (ck[i], ck[i + 1]) if kind == "k" else (None, None)
            if kind == "lse":
                args.append(t[:, cq[i]:cq[i + 1]].unsqueeze(0))
            else:
                args.append(t[a:z].unsqueeze(0))
        outs.append(fn(*args))
    return outs


def _dense_fwd(q, k, v, causal, scale, wl, wr, out=None):
    """q, k, v [b, s, h, d] views: fattn, else the composite.  (out, lse)."""
    if (wl, wr) == (-1, -1):
        try:
            dims = _core.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
            if out is None:
                out = torch.empty(dims.o_shape, dtype=q.dtype, device=q.device)
            return _ops()._fwd_impl(q, k, v, causal, scale, None, out=out)
        except Exception as e:  # noqa: BLE001 - unsupported inputs fall back, other errors propagate
            if not _fallback(e):
                raise
    o, lse = composite_forward(q, k, v, causal, scale, wl, wr)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


def _dense_bwd(dout, q, k, v, out, lse, causal, scale, wl, wr):
    if (wl, wr) == (-1, -1):
        try:
            dims = _core.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
            return _ops()._bwd_impl(dims, dout, q, k, v, out, lse, causal, scale, False)[:3]  # no sink: no dsink
        except Exception as e:  # noqa: BLE001
            if not _fallback(e):
                raise
    return composite_backward(dout, q, k, v, out, lse, causal, scale, wl, wr)


def _checks(dropout_p, return_debug_mask=False, alibi_slopes=None, block_table=None):
    if dropout_p:
        _no("dropout_p=%r (attention dropout)" % (dropout_p,))
    if return_debug_mask:
        _no("return_debug_mask=True")
    if alibi_slopes is not None:
        _no("alibi_slopes")
    if block_table is not None:
        _no("block_table (a paged KV cache)")


def _aux(device):
    return (torch.zeros(2, dtype=torch.uint64, device=device), torch.zeros((), dtype=torch.uint64, device=device),
            torch.empty(0, device=device))


def _bshd(*ts):
    return tuple(t.transpose(1, 2) for t in ts)


def sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention: query [b, hq, sq, d] (SDPA's layout)."""
    _checks(dropout_p, return_debug_mask)
    sc = _core.resolve_scale(scale, query.shape[-1])
    out_bhsd = query.new_empty(query.shape[:-1] + (value.shape[-1],))
    q, k, v, o = _bshd(query, key, value, out_bhsd)
    _, lse = _dense_fwd(q, k, v, bool(is_causal), sc, -1, -1, out=o)
    rng, offset, debug = _aux(query.device)
    return out_bhsd, lse, None, None, query.shape[2], key.shape[2], rng, offset, debug


def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                        is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward, in SDPA's layout."""
    _checks(dropout_p)
    sc = _core.resolve_scale(scale, query.shape[-1])
    g = _dense_bwd(*_bshd(grad_out, query, key, value, out), logsumexp, bool(is_causal), sc, -1, -1)
    return _bshd(*g)


def flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
                  *, scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
                  block_table=None, num_splits=None, out=None):
    """aten::_flash_attention_forward: FlashAttention's layout, dense [b, s, h, d] or packed
    [t, h, d] with cum_seq_q/k (torch.nn.attention.varlen)."""
    _checks(dropout_p, return_debug_mask, alibi_slopes, block_table)
    sc = _core.resolve_scale(scale, query.shape[-1])
    causal, wl, wr = _window(window_size_left, window_size_right, is_causal)
    if cum_seq_q is None:
        if seqused_k is not None:
            _no("seqused_k on a dense call")
        o, lse = _dense_fwd(query, key, value, causal, sc, wl, wr, out=out)
    else:
        o, lse = _varlen_fwd(query, key, value, cum_seq_q, cum_seq_k, int(max_q), int(max_k), causal, sc, wl, wr,
                             seqused_k)
        if out is not None:
            out.copy_(o)
            o = out
    rng, offset, debug = _aux(query.device)
    return o, lse, rng, offset, debug


def flash_forward_no_dropout_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                     is_causal, return_debug_mask, *, scale=None, window_size_left=None,
                                     window_size_right=None, seqused_k=None, alibi_slopes=None, block_table=None,
                                     num_splits=None):
    """aten::_flash_attention_forward_no_dropout_inplace: writes out, returns the LSE."""
    return flash_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                         return_debug_mask, scale=scale, window_size_left=window_size_left,
                         window_size_right=window_size_right, seqused_k=seqused_k, alibi_slopes=alibi_slopes,
                         block_table=block_table, num_splits=num_splits, out=out)[1]


def flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None):
    """aten::_flash_attention_backward: (dq, dk, dv) in FlashAttention's layout."""
    _checks(dropout_p)
    sc = _core.resolve_scale(scale, query.shape[-1])
    causal, wl, wr = _window(window_size_left, window_size_right, is_causal)
    if cum_seq_q is None or cum_seq_q.numel() == 0:
        return _dense_bwd(grad_out, query, key, value, out, logsumexp, causal, sc, wl, wr)
    if (wl, wr) == (-1, -1):
        try:
            return _ops().bwd_varlen(grad_out, query, key, value, out, logsumexp.contiguous(), cum_seq_q, cum_seq_k,
                                     int(max_q), int(max_k), causal, sc, False)[:3]  # no sink: no dsink
        except Exception as e:  # noqa: BLE001
            if not _fallback(e):
                raise
    parts = _per_sequence(lambda do, q, k, v, o, lse: composite_backward(do, q, k, v, o, lse, causal, sc, wl, wr),
                          cum_seq_q, cum_seq_k, ("q", grad_out), ("q", query), ("k", key), ("k", value),
                          ("q", out), ("lse", logsumexp))
    return tuple(torch.cat([p[i][0] for p in parts]) if parts else t.new_zeros(t.shape)
                 for i, t in enumerate((query, key, value)))


def _varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, wl, wr, seqused_k):
    if (wl, wr) == (-1, -1):
        try:
            return _ops().fwd_varlen(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, False)
        except Exception as e:  # noqa: BLE001
            if not _fallback(e):
                raise
    if seqused_k is not None:
        _no("seqused_k with a sliding window")
    parts = _per_sequence(lambda q1, k1, v1: composite_forward(q1, k1, v1, causal, scale, wl, wr), cu_q, cu_k,
                          ("q", q), ("k", k), ("k", v))
    out = torch.cat([p[0][0] for p in parts]) if parts else q.new_zeros(q.shape[:-1] + (v.shape[-1],))
    lse = torch.cat([p[1][0] for p in parts], 1) if parts else q.new_zeros((q.shape[1], 0), dtype=torch.float32)
    return out, lse
