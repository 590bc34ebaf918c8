"""_torch_kvcache.py - flash_attn_with_kvcache on torch tensors: the custom ops
<ns>::fwd_kvcache, fwd_kvcache_fp8 and fwd_kvcache_varlen (fattn_kv_append, then
fattn_fwd on the cache) and kv_append_rows (the appends fattn_kv_append lacks, by
indexing), with their fake implementations; imported by _torch.py, so that the
ops are registered with the others."""
from typing import Optional, Tuple

import torch

from . import _chunk, _core
from ._torch import (_DTYPES, _NS, _check_inputs, _context, _int32_on, _new_outputs, _on_current_stream, _op_sink,
                     _readable, _sink_tensor, _variants)


# ---------------------------------------------------------------------------
# Decoding on a KV cache: fattn_kv_append, then fattn_fwd with seqused_k and
# (paged) block_table; fattn.flash_attn_with_kvcache
# ---------------------------------------------------------------------------

def _cache_desc(t, name):
    """Desc of a cache, read (and written) where it is: never a copy."""
    d = _core.describe(t, name)
    if d.c_strides is None:
        raise ValueError("fattn: %s's layout %s with strides %s cannot be used in place: the head dim must be "
                         "contiguous and no dimension expanded" % (name, tuple(t.shape), tuple(t.stride())))
    return d


def _kv8_scale_block(scale, cache):
    """fattn_tensor's scale_block of an e4m3 cache's scales: [entries, hkv] one per
    page or sequence (the cache's rows), [entries, hkv, rows] one per token."""
    return 1 if scale.dim() == 3 else cache.shape[1]


def _kvcache_impl(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                  window_left=-1, window_right=-1, softcap=0.0, sink=None, k_scale=None, v_scale=None,
                  cache_batch_idx=None, cache_leftpad=None):
    kv = _core.check_kvcache_shapes(q.shape, k_cache.shape, v_cache.shape, None if k is None else k.shape,
                                    None if v is None else v.shape,
                                    None if page_table is None else page_table.shape,
                                    cache_batch=cache_batch_idx is not None)
    dims = kv.dims
    append = k is not None and dims.b > 0 and kv.seqlen_new > 0 and dims.hkv > 0
    if k is not None and cache_seqlens is None:
        raise ValueError("fattn: k and v (rows to append) need cache_seqlens (where each sequence's rows go)")
    if not append and dims.empty:
        return _new_outputs(dims, q, None, sink)
    out = torch.empty(dims.o_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(dims.lse_shape, dtype=torch.float32, device=q.device)
    for name, t, shape in (("cache_seqlens", cache_seqlens, (dims.b,)),
                           ("page_table", page_table, (dims.b, kv.max_pages))):
        if t is not None and (t.dtype != torch.int32 or t.device != q.device or tuple(t.shape) != shape
                              or not t.is_contiguous()):
            raise ValueError("fattn: %s must be a contiguous int32 tensor %s on %s, got %s %s on %s"
                             % (name, shape, q.device, t.dtype, tuple(t.shape), t.device))
    ctx = _context(q.device)
    q, qd = _readable(q, "q")
    kcd, vcd = _cache_desc(k_cache, "k_cache"), _cache_desc(v_cache, "v_cache")
    scales = None  # an e4m3 cache: (k scale pointer, block, v scale pointer, block)
    if k_scale is not None:
        scales = (k_scale.data_ptr(), _kv8_scale_block(k_scale, k_cache), v_scale.data_ptr(),
                  _kv8_scale_block(v_scale, v_cache))
    seqlens_ptr = cache_seqlens.data_ptr() if cache_seqlens is not None else None
    table_ptr = page_table.data_ptr() if page_table is not None else None
    seqused = cache_seqlens
    if append and cache_batch_idx is not None:
        # fattn_kv_append has no cache_batch_idx: the rows go into entries cache_batch_idx[b] by indexing
        seqused = cache_seqlens + _append_rows(k_cache, v_cache, k, v, cache_seqlens, None, cache_batch_idx)
        append = False
    if append:
        k, knd = _readable(k, "k")
        v, vnd = _readable(v, "v")
        seqused = cache_seqlens + kv.seqlen_new  # on the device, no host synchronisation
    od = _core.describe(out, "out")
    with ctx._lock:
        _on_current_stream(ctx, q.device)
        if append:
            ctx.kv_append_raw(_core.kv_append_struct(kv, knd, vnd, kcd, vcd, seqlens_ptr, table_ptr, scales))
        if dims.empty:
            return _new_outputs(dims, q, None, sink)
        a = _core.fwd_kvcache_struct(kv, qd, kcd, vcd, od, lse.data_ptr(), causal, softmax_scale,
                                     seqused.data_ptr() if seqused is not None else None, table_ptr,
                                     _variants(window_left, window_right, softcap, sink), scales,
                                     cache_batch_idx.data_ptr() if cache_batch_idx is not None else None,
                                     k_cache.shape[0],
                                     cache_leftpad.data_ptr() if cache_leftpad is not None else None)
        # more rows or pages than the decoding kernel takes: fattn_fwd runs them as varlen queries on the cache
        with ctx.option_set(_core.OPTION_DISABLE_SPLIT, int(bool(disable_split))):
            ctx.fwd_raw(a)
    return out, lse


def _append_rows(k_cache, v_cache, k, v, cache_seqlens, page_table=None, cache_batch_idx=None,
                 cu_seqlens_k_new=None):
    """k, v written into the caches by indexing: the bytes fattn_kv_append would copy, for the forms it lacks
    (FA3's cache_batch_idx on a contiguous cache, cu_seqlens_k_new's packed rows).  k, v [b, s_new, hkv, d]
    (dv), or packed [total_new, hkv, d] with cu_seqlens_k_new (int32 [b + 1], sequence b's new rows
    cu_seqlens_k_new[b] .. [b + 1] - 1).  New row t of sequence b becomes row cache_seqlens[b] + t of entry
    cache_batch_idx[b] (b without it) of a contiguous cache, or of the pages page_table[b] names.  Returns
    the new rows' counts, int32 [b] on the device (nothing read on the host but on the CPU).  A row whose
    destination is out of range (past the capacity or the table, an entry or page outside the cache):
    ValueError on the CPU before anything is written (as fattn_kv_append's check), left out on CUDA (as its
    kernel does; the mask costs a host synchronisation there).  One cache row written twice: either value."""
    b, dev = cache_seqlens.shape[0], k.device
    if cu_seqlens_k_new is None:
        s_new = k.shape[1]
        seq = torch.arange(b, device=dev).repeat_interleave(s_new)
        t = torch.arange(s_new, device=dev).repeat(b)
        k, v = k.reshape((b * s_new,) + tuple(k.shape[2:])), v.reshape((b * s_new,) + tuple(v.shape[2:]))
        new_len = torch.full((b,), s_new, dtype=torch.int32, device=dev)
        ok = torch.ones_like(seq, dtype=torch.bool)
    else:
        cu = cu_seqlens_k_new.long()
        r = torch.arange(k.shape[0], device=dev)
        seq = torch.searchsorted(cu[1:], r, right=True)  # the sequence of packed row r (b: past cu[b])
        ok = (seq < b) & (r >= cu[0])
        seq = seq.clamp(max=b - 1)
        t = r - cu[seq]
        new_len = (cu[1:] - cu[:-1]).to(torch.int32)
    if b == 0 or k.shape[0] == 0:
        return new_len
    pos = cache_seqlens.long()[seq] + t
    ok &= pos >= 0
    if page_table is None:
        ent = cache_batch_idx.long()[seq] if cache_batch_idx is not None else seq
        ok &= (pos < k_cache.shape[1]) & (ent >= 0) & (ent < k_cache.shape[0])
        where = "past the cache's capacity %d, or cache_batch_idx outside [0, %d)" % (k_cache.shape[1],
                                                                                      k_cache.shape[0])
    else:
        ps, mp = k_cache.shape[1], page_table.shape[1]
        ent = page_table.long()[seq, (pos // ps).clamp(0, mp - 1)]
        ok &= (pos < mp * ps) & (ent >= 0) & (ent < k_cache.shape[0])
        where = "past max_pages_per_seq * page_size = %d, or on a page outside [0, %d)" % (mp * ps, k_cache.shape[0])
        pos = pos % ps
    if dev.type == "cpu":
        if not bool(ok.all()):
            raise ValueError("fattn: new rows at cache_seqlens + their index %s" % where)
    else:
        ent, pos, k, v = ent[ok], pos[ok], k[ok], v[ok]
    k_cache[ent, pos] = k
    v_cache[ent, pos] = v
    return new_len


@torch.library.custom_op(_NS + "::kv_append_rows", mutates_args=("k_cache", "v_cache"))
def kv_append_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cache_seqlens: torch.Tensor, page_table: Optional[torch.Tensor],
                   cache_batch_idx: Optional[torch.Tensor], cu_seqlens_k_new: Optional[torch.Tensor]) -> torch.Tensor:
    """_append_rows as an op (it writes the caches): the append of flash_attn_with_kvcache's forms that
    fattn_kv_append lacks (cu_seqlens_k_new, or new rows beside cu_seqlens_q), before the attention.
    Returns the new rows' counts, int32 [b]."""
    return _append_rows(k_cache, v_cache, k, v, cache_seqlens, page_table, cache_batch_idx, cu_seqlens_k_new)


@kv_append_rows.register_fake
def _kv_append_rows_fake(k_cache, v_cache, k, v, cache_seqlens, *rest):
    return cache_seqlens.new_empty(cache_seqlens.shape)


@torch.library.custom_op(_NS + "::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor], page_table: Optional[torch.Tensor],
                causal: bool, softmax_scale: float, disable_split: bool, window_left: int = -1,
                window_right: int = -1, softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                cache_batch_idx: Optional[torch.Tensor] = None,
                cache_leftpad: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decoding on a KV cache: k, v (or None) appended in place into k_cache, v_cache at the rows
    cache_seqlens (int32 [b]) says (fattn_kv_append), then attention of q over each sequence's first
    cache_seqlens (+ k's seqlen when appending) keys (fattn_fwd with seqused_k; cache_seqlens None = all
    keys).  page_table int32 [b, max_pages] (contiguous): the caches are page pools [num_pages, page_size,
    hkv, d].  disable_split: FATTN_OPTION_DISABLE_SPLIT for the call.  The variants as fwd's.
    cache_batch_idx (int32 [b]: sequence b's entry of a contiguous cache) and cache_leftpad (int32 [b]: its
    keys from that row on): FA3's (fattn.h).
    (out [b, sq, hq, dv], lse [b, hq, sq] float32, the sink included).  No autograd."""
    return _kvcache_impl(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                         window_left, window_right, softcap, _op_sink(learnable_sink, q),
                         cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                      *variants):
    b, sq, hq, _ = q.shape
    return (q.new_empty((b, sq, hq, v_cache.shape[3])), q.new_empty((b, hq, sq), dtype=torch.float32))


# An op of its own for an FP8 cache: its scales are written (mutated) too, and a
# mutated argument must not be Optional (torch's in-place bookkeeping indexes it).
@torch.library.custom_op(_NS + "::fwd_kvcache_fp8", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))
def fwd_kvcache_fp8(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                    v_scale: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                    cache_seqlens: Optional[torch.Tensor], page_table: Optional[torch.Tensor], causal: bool,
                    softmax_scale: float, disable_split: bool, window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                    cache_leftpad: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """fwd_kvcache on an FP8 KV cache: float8_e4m3fn k_cache, v_cache with their float32 scales
    k_scale, v_scale (kvcache's checks), which an append writes as it quantises k, v."""
    return _kvcache_impl(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal, softmax_scale, disable_split,
                         window_left, window_right, softcap, _op_sink(learnable_sink, q), k_scale, v_scale,
                         cache_leftpad=cache_leftpad)


@fwd_kvcache_fp8.register_fake
def _fwd_kvcache_fp8_fake(q, k_cache, v_cache, k_scale, v_scale, *rest):
    b, sq, hq, _ = q.shape
    return (q.new_empty((b, sq, hq, v_cache.shape[3])), q.new_empty((b, hq, sq), dtype=torch.float32))


@torch.library.custom_op(_NS + "::fwd_kvcache_varlen", mutates_args=())
def fwd_kvcache_varlen(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                       cache_seqlens: Optional[torch.Tensor], page_table: Optional[torch.Tensor], max_seqlen_q: int,
                       causal: bool, softmax_scale: float, window_left: int = -1, window_right: int = -1,
                       softcap: float = 0.0, learnable_sink: Optional[torch.Tensor] = None,
                       cache_batch_idx: Optional[torch.Tensor] = None,
                       cache_leftpad: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                       v_scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen queries on a KV cache (chunked prefill; fattn_fwd with cu_seqlens_q alone): q [total_q, hq,
    d] packed by cu_seqlens_q (int32 [b + 1]), sequence b attending its first cache_seqlens[b] keys of the
    cache (None: all), causal bottom-right aligned on them.  cache_batch_idx and cache_leftpad (int32 [b]) as
    fwd_kvcache's; k_scale, v_scale: an FP8 cache's (_check_kv8).  (out [total_q, hq, dv], lse [hq, total_q]
    float32, the sink included).  No append (the caller's kv_append_rows comes first), no autograd."""
    b, total_q = cu_seqlens_q.shape[0] - 1, q.shape[0]
    kv = _core.check_kvcache_shapes((b, max_seqlen_q) + tuple(q.shape[1:]), k_cache.shape, v_cache.shape, None,
                                    None, None if page_table is None else page_table.shape,
                                    cache_batch=cache_batch_idx is not None)
    sink = _op_sink(learnable_sink, q)
    out = torch.empty((total_q, kv.dims.hq, kv.dims.dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((kv.dims.hq, total_q), dtype=torch.float32, device=q.device)
    if total_q == 0 or b == 0 or kv.dims.hq == 0:
        return out, lse
    ctx = _context(q.device)
    q, qd = _readable(q.unsqueeze(0), "q")
    kcd, vcd = _cache_desc(k_cache, "k_cache"), _cache_desc(v_cache, "v_cache")
    od = _core.describe(out.unsqueeze(0), "out")
    scales = None if k_scale is None else (k_scale.data_ptr(), _kv8_scale_block(k_scale, k_cache),
                                           v_scale.data_ptr(), _kv8_scale_block(v_scale, v_cache))
    a = _core.fwd_kvcache_struct(kv, qd, kcd, vcd, od, lse.data_ptr(), causal, softmax_scale,
                                 cache_seqlens.data_ptr() if cache_seqlens is not None else None,
                                 page_table.data_ptr() if page_table is not None else None,
                                 _variants(window_left, window_right, softcap, sink), scales,
                                 cache_batch_idx.data_ptr() if cache_batch_idx is not None else None,
                                 k_cache.shape[0],
                                 cache_leftpad.data_ptr() if cache_leftpad is not None else None)
    a.p.cu_seqlens_q = cu_seqlens_q.data_ptr()
    a.p.total_q = total_q
    with ctx._lock:
        _on_current_stream(ctx, q.device)
        ctx.fwd_raw(a)
    return out, lse


@fwd_kvcache_varlen.register_fake
def _fwd_kvcache_varlen_fake(q, k_cache, v_cache, *rest):
    return (q.new_empty((q.shape[0], q.shape[1], v_cache.shape[3])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


def _check_kv8(q, k_cache, v_cache, k_scale, v_scale):
    """An FP8 KV cache's tensors (flash_attn_with_kvcache's docstring): True for
    an e4m3 cache with its scales, False for a 16-bit one without; TypeError /
    ValueError naming the tensor otherwise."""
    e4m3 = [isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in (k_cache, v_cache)]
    if not any(e4m3):
        if k_scale is not None or v_scale is not None:
            raise ValueError("fattn: k_scale and v_scale go with a float8_e4m3fn k_cache and v_cache (an FP8 KV "
                             "cache); the caches are %s" % (k_cache.dtype,))
        return False
    if not all(e4m3):
        raise TypeError("fattn: k_cache and v_cache must both be float8_e4m3fn (an FP8 KV cache), got %s and %s"
                        % (k_cache.dtype, v_cache.dtype))
    if not isinstance(q, torch.Tensor) or q.dtype not in _DTYPES:
        raise TypeError("fattn: an FP8 KV cache takes float16, bfloat16 or float32 q, got %s"
                        % (getattr(q, "dtype", type(q).__name__),))
    if not (q.device == k_cache.device == v_cache.device):
        raise ValueError("fattn: q, k_cache and v_cache must be on one device, got %s, %s and %s"
                         % (q.device, k_cache.device, v_cache.device))
    for name, sc, cache in (("k_scale", k_scale, k_cache), ("v_scale", v_scale, v_cache)):
        if sc is None:
            raise ValueError("fattn: a float8_e4m3fn cache needs %s (float32 [num_pages, hkv] per page or "
                             "[num_pages, hkv, page_size] per token)" % name)
        want2, want3 = (cache.shape[0], cache.shape[2]), (cache.shape[0], cache.shape[2], cache.shape[1])
        if not isinstance(sc, torch.Tensor) or sc.dtype != torch.float32 or not sc.is_contiguous() \
                or sc.device != q.device or tuple(sc.shape) not in (want2, want3):
            raise ValueError("fattn: %s must be a contiguous float32 tensor on %s of shape %s (one scale per page "
                             "or sequence and kv head) or %s (per token and kv head), got %s"
                             % (name, q.device, want2, want3,
                                "%s %s on %s" % (sc.dtype, tuple(sc.shape), sc.device)
                                if isinstance(sc, torch.Tensor) else type(sc).__name__))
    return True


def _batch_idx_rows(cache_batch_idx, page_table, b, device):
    """(cache_batch_idx, page_table) for the kernels: the index as int32 [b] on device; with a page table
    it picks each sequence's row of the table (FA3's meaning), and is then not passed on (None)."""
    if cache_batch_idx is None:
        return None, page_table
    cache_batch_idx = _int32_on(cache_batch_idx, "cache_batch_idx", device, (b,))
    if page_table is None:
        return cache_batch_idx, None
    return None, page_table[cache_batch_idx.long()].contiguous()


def _cache_index(page_table, cache_seqlens, b, device):
    """page_table [b, max_pages] and cache_seqlens ([b] tensor or an int) of b sequences as contiguous int32
    tensors on device (None stays None); TypeError / ValueError naming the argument otherwise."""
    if page_table is not None:
        if isinstance(page_table, torch.Tensor) and page_table.dim() != 2:
            raise ValueError("fattn: page_table must be [batch, max_pages_per_seq], got shape %s"
                             % (tuple(page_table.shape),))
        page_table = _int32_on(page_table, "page_table", device,
                               (b, page_table.shape[1]) if isinstance(page_table, torch.Tensor) else None)
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, torch.Tensor):
            cache_seqlens = _int32_on(cache_seqlens, "cache_seqlens", device, (b,))
        else:
            if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
                raise TypeError("fattn: cache_seqlens must be an int or an int32 tensor [batch], got a %s"
                                % type(cache_seqlens).__name__)
            if not 0 <= cache_seqlens <= 2 ** 31 - 1:
                raise ValueError("fattn: cache_seqlens must be in [0, 2**31), got %d" % cache_seqlens)
            cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=device)
    return page_table, cache_seqlens


def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale, causal, disable_split,
            window_size=None, softcap=0.0, learnable_sink=None, k_scale=None, v_scale=None, cu_seqlens_q=None,
            max_seqlen_q=None, cache_batch_idx=None, cache_leftpad=None, cu_seqlens_k_new=None, chunk=0):
    """fattn.flash_attn_with_kvcache once its FA3 arguments are checked: (out, lse);
    window_size None or (left, right), softcap, learnable_sink: fattn.attention's;
    k_scale, v_scale: an FP8 KV cache's scales (_check_kv8); cu_seqlens_q with
    max_seqlen_q: q packed [total_q, hq, d], out [total_q, hq, dv], lse [hq,
    total_q]; cu_seqlens_k_new: k, v packed [total_new, hkv, d (dv)]; chunk: FA3's attention_chunk
    (_chunk.py: the call as varlen queries on the cache, split by chunk)."""
    if _check_kv8(q, k_cache, v_cache, k_scale, v_scale):
        _check_inputs(q, q, q)
    else:
        _check_inputs(q, k_cache, v_cache)
    if (k is None) != (v is None):
        raise ValueError("fattn: k and v (the rows to append) must be given together")
    if k is not None:
        _check_inputs(q, k, v)
    grads = [n for n, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                            ("learnable_sink", learnable_sink), ("k_scale", k_scale), ("v_scale", v_scale))
             if isinstance(t, torch.Tensor) and t.requires_grad]
    if grads and torch.is_grad_enabled():
        raise NotImplementedError("fattn.flash_attn_with_kvcache is forward only (decoding; FlashAttention's has no "
                                  "backward either), but %s require%s grad: call it under torch.no_grad() or "
                                  "torch.inference_mode(), or on detached tensors"
                                  % (", ".join(grads), "s" if len(grads) == 1 else ""))
    if cu_seqlens_k_new is not None and k is None:
        raise ValueError("fattn: cu_seqlens_k_new goes with k and v, the packed rows to append")
    if (cu_seqlens_q is not None or cu_seqlens_k_new is not None) and k is not None and k_scale is not None:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: k, v to append with cu_seqlens_q or "
                                  "cu_seqlens_k_new on an FP8 KV cache are not supported by fattn (fattn_kv_append, "
                                  "which quantises the rows, takes [batch, seqlen_new] rows only): append with "
                                  "fattn's kv_append first, then attend")
    if chunk and k is not None and k_scale is not None:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: attention_chunk with k, v to append to an FP8 "
                                  "KV cache is not supported by fattn (the chunked call appends by indexing, which "
                                  "cannot quantise): append with fattn's kv_append first, then attend")
    if cu_seqlens_q is not None:
        return _kvcache_varlen(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale, causal,
                               window_size, softcap, learnable_sink, k_scale, cu_seqlens_q, max_seqlen_q,
                               cache_batch_idx, cache_leftpad, cu_seqlens_k_new, v_scale, chunk)
    if chunk:  # fixed-length queries as a varlen batch of equal lengths, split by chunk (_chunk.py)
        if q.dim() != 4:
            raise ValueError("fattn: q must be 4-D [batch, seqlen, heads, head_dim], got shape %s" % (tuple(q.shape),))
        b, sq = q.shape[:2]
        cu = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
        out, lse = _kvcache_varlen(q.reshape(b * sq, *q.shape[2:]), k_cache, v_cache, k, v, cache_seqlens,
                                   page_table, softmax_scale, causal, window_size, softcap, learnable_sink, k_scale,
                                   cu, sq, cache_batch_idx, cache_leftpad, cu_seqlens_k_new, v_scale, chunk)
        return out.view(b, sq, *out.shape[1:]), lse.view(lse.shape[0], b, sq).permute(1, 0, 2)
    if q.dim() != 4:
        raise ValueError("fattn: q must be 4-D [batch, seqlen, heads, head_dim], got shape %s" % (tuple(q.shape),))
    sink = _sink_tensor(learnable_sink, q)
    b = q.shape[0]
    cache_batch_idx, page_table = _batch_idx_rows(cache_batch_idx, page_table, b, q.device)
    if cache_batch_idx is not None and k_scale is not None:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: cache_batch_idx on a contiguous FP8 KV cache "
                                  "is not supported by fattn")
    page_table, cache_seqlens = _cache_index(page_table, cache_seqlens, b, q.device)
    if k is not None and cache_seqlens is None:
        raise ValueError("fattn: k and v (rows to append) need cache_seqlens (where each sequence's rows go), as "
                         "FlashAttention's")
    if cache_leftpad is not None:
        cache_leftpad = _int32_on(cache_leftpad, "cache_leftpad", q.device, (b,))
    packed = cu_seqlens_k_new is not None  # k, v packed rows: appended here by indexing (kv_append_rows)
    kv = _core.check_kvcache_shapes(q.shape, k_cache.shape, v_cache.shape, None if k is None or packed else k.shape,
                                    None if v is None or packed else v.shape,
                                    None if page_table is None else page_table.shape,
                                    cache_batch=cache_batch_idx is not None)
    if kv.seqlen_new and kv.dims.dv != kv.dims.d:
        raise NotImplementedError("fattn.flash_attn_with_kvcache: appending k, v with head_dim_v %d != head_dim %d "
                                  "is not supported by fattn (fattn_kv_append copies rows of one head_dim)"
                                  % (kv.dims.dv, kv.dims.d))
    scale = _core.resolve_scale(softmax_scale, kv.dims.d)
    if packed:  # every check done: the rows are written, then attended as part of the cache
        cu_k_new = _check_packed_new(k, v, cu_seqlens_k_new, b, kv.dims, q.device)
        cache_seqlens = cache_seqlens + kv_append_rows(k_cache, v_cache, k, v, cache_seqlens, page_table,
                                                       cache_batch_idx, cu_k_new)
        k = v = None
    wl, wr = window_size if window_size is not None else (-1, -1)
    if k_scale is not None:
        return fwd_kvcache_fp8(q, k_cache, v_cache, k_scale, v_scale, k, v, cache_seqlens, page_table, bool(causal),
                               scale, bool(disable_split), int(wl), int(wr), float(softcap), sink, cache_leftpad)
    return fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table, bool(causal), scale,
                       bool(disable_split), int(wl), int(wr), float(softcap), sink, cache_batch_idx, cache_leftpad)


def _check_packed_new(k, v, cu_seqlens_k_new, b, dims, device):
    """FA3's cu_seqlens_k_new with k, v packed [total_new, hkv, d] and [total_new, hkv, dv]: the
    cu_seqlens_k_new int32 [b + 1] on device (its entries are read on the device only); ValueError
    otherwise."""
    if k.dim() != 3 or v.dim() != 3 or tuple(k.shape[1:]) != (dims.hkv, dims.d) \
            or tuple(v.shape) != (k.shape[0], dims.hkv, dims.dv):
        raise ValueError("fattn: with cu_seqlens_k_new, k and v must be packed [total_new, heads_kv, head_dim] = "
                         "[n, %d, %d] and [n, %d, %d], got %s and %s" % (dims.hkv, dims.d, dims.hkv, dims.dv,
                                                                         tuple(k.shape), tuple(v.shape)))
    return _int32_on(cu_seqlens_k_new, "cu_seqlens_k_new", device, (b + 1,))


def _kvcache_varlen(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale, causal, window_size, softcap,
                    learnable_sink, k_scale, cu_seqlens_q, max_seqlen_q, cache_batch_idx=None, cache_leftpad=None,
                    cu_seqlens_k_new=None, v_scale=None, chunk=0):
    """kvcache with cu_seqlens_q: varlen queries on the cache (fwd_kvcache_varlen), after the append of k, v
    ([b, s_new, hkv, d], or packed with cu_seqlens_k_new) by indexing (kv_append_rows)."""
    if q.dim() != 3:
        raise ValueError("fattn: with cu_seqlens_q, q must be packed [total_q, heads, head_dim], got shape %s"
                         % (tuple(q.shape),))
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
        raise ValueError("fattn: cu_seqlens_q must be an int32 tensor [batch + 1]")
    b = cu_seqlens_q.shape[0] - 1
    cu = _int32_on(cu_seqlens_q, "cu_seqlens_q", q.device, (b + 1,))
    if max_seqlen_q is None or isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise ValueError("fattn: cu_seqlens_q needs max_seqlen_q, an int >= every sequence's query count (the "
                         "lengths are not read on the host), got %r" % (max_seqlen_q,))
    sink = _sink_tensor(learnable_sink, q)
    cache_batch_idx, page_table = _batch_idx_rows(cache_batch_idx, page_table, b, q.device)
    if cache_leftpad is not None:
        cache_leftpad = _int32_on(cache_leftpad, "cache_leftpad", q.device, (b,))
    page_table, cache_seqlens = _cache_index(page_table, cache_seqlens, b, q.device)
    kv = _core.check_kvcache_shapes((b, max_seqlen_q) + tuple(q.shape[1:]), k_cache.shape, v_cache.shape, None,
                                    None, None if page_table is None else page_table.shape,
                                    cache_batch=cache_batch_idx is not None)
    cu_k_new = None
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("fattn: k and v (rows to append) need cache_seqlens (where each sequence's rows go), "
                             "as FlashAttention's")
        if cu_seqlens_k_new is not None:
            cu_k_new = _check_packed_new(k, v, cu_seqlens_k_new, b, kv.dims, q.device)
        else:  # [b, s_new, hkv, d (dv)]
            _core.check_kvcache_shapes((b, 1) + tuple(q.shape[1:]), k_cache.shape, v_cache.shape, k.shape, v.shape,
                                       None if page_table is None else page_table.shape,
                                       cache_batch=cache_batch_idx is not None)
    scale = _core.resolve_scale(softmax_scale, q.shape[2])
    if k is not None:  # every check done: the rows are written, then attended as part of the cache
        cache_seqlens = cache_seqlens + kv_append_rows(k_cache, v_cache, k, v, cache_seqlens, page_table,
                                                       cache_batch_idx, cu_k_new)
    wl, wr = window_size if window_size is not None else (-1, -1)
    if chunk:  # each sequence as its chunks' sub-sequences on the same cache row (_chunk.py)
        cap = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])
        lens = (cache_seqlens.long().clamp_max(cap) if cache_seqlens is not None
                else torch.full((b,), cap, dtype=torch.long, device=q.device))
        if cache_leftpad is not None:
            lens = lens - torch.minimum(cache_leftpad.long().clamp_min(0), lens)
        cu, cache_seqlens, cache_leftpad, n = _chunk.cache_split(cu, lens, cache_leftpad, chunk, cap)
        if page_table is not None:
            page_table = page_table.repeat_interleave(n, 0)
        else:
            rows = cache_batch_idx if cache_batch_idx is not None else torch.arange(b, dtype=torch.int32,
                                                                                    device=q.device)
            cache_batch_idx = rows.repeat_interleave(n)
    return fwd_kvcache_varlen(q, k_cache, v_cache, cu, cache_seqlens, page_table, int(max_seqlen_q), bool(causal),
                              scale, int(wl), int(wr), float(softcap), sink, cache_batch_idx, cache_leftpad,
                              k_scale, v_scale)
