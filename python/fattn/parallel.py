"""parallel.py - context parallelism: ring attention over torch.distributed.

    import torch.distributed as dist, fattn.parallel as fp
    # every rank holds its slice of the sequence, [b, s / W, h, d] (fattn's layout)
    q_loc = fp.zigzag_shard(q, rank, world)          # causal: the zigzag split (below)
    o_loc = fp.ring_attention(q_loc, k_loc, v_loc, group=None, causal=True)

The sequence is split over the W ranks of `group` (NCCL on GPUs, gloo on the CPU).
K/V blocks travel once around the ring (isend/irecv to rank + 1, from rank - 1);
each step runs fattn's forward with LSE on the local queries and the visiting block,
and the steps are merged in float32 by their LSEs.  The backward (an autograd
Function) runs fattn's backward on each block with the *global* O and LSE, keeps
dQ local in float32 and passes dK/dV around the ring with the blocks they belong to.

Layout of the inputs:
  - causal=False: any split of the sequence, e.g. rank r holds tokens
    [r * s / W, (r + 1) * s / W) (contiguous_shard); every rank holds as many tokens.
  - causal=True: the zigzag split.  The sequence is cut into 2W equal chunks and
    rank r holds chunks r and 2W - 1 - r, concatenated (zigzag_shard /
    zigzag_unshard).  Every rank then has the same causal work (the first chunk's
    rows are short, the second's long).  The local length must be even; the causal
    mask is the global one (token i sees tokens <= i of the whole sequence).
Varlen (ring_attention_varlen): the same, per sequence of a packed batch.
"""
import torch
import torch.distributed as dist

from . import _core

__all__ = ["ring_attention", "ring_attention_varlen", "block_forward", "block_backward", "zigzag_shard",
           "zigzag_unshard", "contiguous_shard", "zigzag_shard_varlen", "zigzag_unshard_varlen"]


def _ops():
    from . import _torch_module
    return _torch_module()


# ---------------------------------------------------------------------------
# One block: fattn's forward with LSE, and its backward with an outside O and LSE
# ---------------------------------------------------------------------------

def block_forward(q, k, v, causal, softmax_scale, deterministic=False, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None):
    """fattn's forward of one block: (out in q's dtype, lse float32, natural log).
    Dense q [b, sq, hq, d] (lse [b, hq, sq]) or, with cu_seqlens_q/k and
    max_seqlen_q/k, packed q [tq, hq, d] (lse [hq, tq]).  causal is bottom-right
    aligned; softmax_scale a float."""
    ops = _ops()
    if cu_seqlens_q is None:
        return ops.fwd(q, k, v, bool(causal), float(softmax_scale), False, bool(deterministic))
    return ops.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, None, int(max_seqlen_q), int(max_seqlen_k),
                          bool(causal), float(softmax_scale), bool(deterministic))


def _cpu16(t):
    return t.device.type == "cpu" and t.dtype in (torch.float16, torch.bfloat16)


def block_backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic=False, cu_seqlens_q=None,
                   cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """fattn's backward of one block with an outside O and LSE (the merged result
    of every block, as ring attention has): D = rowsum(dout * out) and P =
    exp(S * scale - lse) come from `out` and `lse`, not from this block alone.
    Returns (dq, dk, dv) in q's dtype, or float32 for 16-bit CPU tensors, whose
    blocks run in float32 here (the ring sums the blocks' gradients; the CPU engine
    computes in f32 anyway)."""
    ops = _ops()
    if _cpu16(q):
        dout, q, k, v, out = (t.float() for t in (dout, q, k, v, out))
    if cu_seqlens_q is None:  # the ops' fourth output is d(sink), empty without a sink
        return ops.bwd(dout, q, k, v, out, lse, bool(causal), float(softmax_scale), bool(deterministic))[:3]
    return ops.bwd_varlen(dout, q, k, v, out, lse.contiguous(), cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                          int(max_seqlen_k), bool(causal), float(softmax_scale), bool(deterministic))[:3]


# ---------------------------------------------------------------------------
# Layout helpers
# ---------------------------------------------------------------------------

def _chunks(x, n, dim, what):
    if x.shape[dim] % n:
        raise ValueError("fattn.parallel: %s has %d tokens along dim %d, not a multiple of %d" % (what, x.shape[dim],
                                                                                                 dim, n))
    return x.chunk(n, dim)


def contiguous_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s contiguous slice of the sequence dimension `dim` (causal=False)."""
    return _chunks(x, world_size, dim, "the sequence")[rank]


def zigzag_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s part of the zigzag split: chunks rank and 2W - 1 - rank of the 2W
    equal chunks of dimension `dim`, concatenated."""
    c = _chunks(x, 2 * world_size, dim, "the sequence")
    return torch.cat([c[rank], c[2 * world_size - 1 - rank]], dim)


def zigzag_unshard(parts, dim=1):
    """The whole sequence from every rank's zigzag part (a list in rank order)."""
    w = len(parts)
    halves = [_chunks(p, 2, dim, "a zigzag part") for p in parts]
    return torch.cat([halves[i][0] for i in range(w)] + [halves[i][1] for i in reversed(range(w))], dim)


def _seq_bounds(cu_seqlens):
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def zigzag_shard_varlen(x, cu_seqlens, rank, world_size):
    """Rank `rank`'s zigzag part of a packed batch x [total, ...] whose sequences
    cu_seqlens (the global int32 [batch + 1]) delimit: each sequence's chunks rank
    and 2W - 1 - rank of its 2W equal chunks, sequences kept in order.  The local
    cu_seqlens are cu_seqlens // W."""
    parts = []
    for a, b in _seq_bounds(cu_seqlens):
        parts.append(zigzag_shard(x[a:b], rank, world_size, dim=0))
    return torch.cat(parts, 0)


def zigzag_unshard_varlen(parts, cu_seqlens):
    """The packed global batch from every rank's zigzag_shard_varlen part (rank order)."""
    w = len(parts)
    out = []
    for a, b in _seq_bounds(cu_seqlens):
        n = (b - a) // w
        out.append(zigzag_unshard([p[a // w:a // w + n] for p in parts], dim=0))
    return torch.cat(out, 0)


# ---------------------------------------------------------------------------
# The ring
# ---------------------------------------------------------------------------

class _Ring:
    """Point-to-point sends to rank + 1 and receives from rank - 1 of a group."""

    def __init__(self, group):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world)

    def start(self, tensors, tag):
        """Send `tensors` on, receive their like from behind: (requests, buffers)."""
        bufs = [torch.empty_like(t) for t in tensors]
        ops = []
        for i, (t, b) in enumerate(zip(tensors, bufs)):
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, b, self.prev, self.group, tag + i))
        return dist.batch_isend_irecv(ops), bufs

    @staticmethod
    def wait(pending):
        reqs, bufs = pending
        for r in reqs:
            r.wait()
        return bufs


_TAG_KV, _TAG_DKV = 0, 2


def _merge(out, lse, block_out, block_lse, seq_dim_of_lse):
    """out, lse (float32, updated in place) <- the softmax over both key sets, from
    block_out, block_lse.  lse's sequence dimension is seq_dim_of_lse (dense [b, h, s]:
    2, varlen [h, t]: 1); out's is the one before heads."""
    new = torch.logaddexp(lse, block_lse)
    # rows that saw no key in either part: -inf - -inf is NaN, their weight is 0
    w_old = torch.exp(lse - new).nan_to_num_(0.0)
    w_blk = torch.exp(block_lse - new).nan_to_num_(0.0)
    if seq_dim_of_lse == 2:   # [b, h, s] -> [b, s, h, 1]
        w_old, w_blk = (w.transpose(1, 2).unsqueeze(-1) for w in (w_old, w_blk))
    else:                     # [h, t] -> [t, h, 1]
        w_old, w_blk = (w.transpose(0, 1).unsqueeze(-1) for w in (w_old, w_blk))
    out.mul_(w_old).add_(block_out.float() * w_blk)
    lse.copy_(new)


def _step_kind(step, causal, rank):
    """Which blocks meet at ring step `step` (the visiting K/V is rank - step's):
    'diag' (own block, causal), 'full' (all q x all k), 'k_first' (all q x the first
    half of k: an earlier rank's zigzag block), 'q_second' (the second half of q x all
    k: a later rank's)."""
    if step == 0:
        return "diag" if causal else "full"
    if not causal:
        return "full"
    return "k_first" if step <= rank else "q_second"


class _DenseLayout:
    """[b, s, h, d] tensors; halves along dim 1; lse [b, h, s]."""
    lse_seq_dim = 2

    def __init__(self, s):
        self.half = s // 2

    def first(self, x):
        return x[:, :self.half]

    def second(self, x):
        return x[:, self.half:]

    def second_lse(self, lse):
        return lse[:, :, self.half:]

    def fwd(self, q, k, v, causal, scale, det, q_half=False, k_half=False):
        return block_forward(q, k, v, causal, scale, det)

    def bwd(self, dout, q, k, v, out, lse, causal, scale, det, q_half=False, k_half=False):
        return block_backward(dout, q, k, v, out, lse, causal, scale, det)


class _VarlenLayout:
    """Packed [t, h, d] tensors whose sequences the local cu_seqlens delimit; "halves"
    are the first and second half of every sequence (gathered by an index); lse [h, t]."""
    lse_seq_dim = 1

    def __init__(self, cu_seqlens, max_seqlen):
        self.cu, self.max = cu_seqlens, max_seqlen
        dev = cu_seqlens.device
        bounds = _seq_bounds(cu_seqlens)
        first = [torch.arange(a, a + (b - a) // 2, device=dev) for a, b in bounds]
        second = [torch.arange(a + (b - a) // 2, b, device=dev) for a, b in bounds]
        self.i_first, self.i_second = torch.cat(first), torch.cat(second)
        self.cu_half = (cu_seqlens // 2).to(torch.int32).contiguous()
        self.max_half = max_seqlen // 2

    def first(self, x):
        return x.index_select(0, self.i_first)

    def second(self, x):
        return x.index_select(0, self.i_second)

    def second_lse(self, lse):
        return lse.index_select(1, self.i_second)

    def _lens(self, half):
        return (self.cu_half, self.max_half) if half else (self.cu, self.max)

    def fwd(self, q, k, v, causal, scale, det, q_half=False, k_half=False):
        (cq, mq), (ck, mk) = self._lens(q_half), self._lens(k_half)
        return block_forward(q, k, v, causal, scale, det, cq, ck, mq, mk)

    def bwd(self, dout, q, k, v, out, lse, causal, scale, det, q_half=False, k_half=False):
        (cq, mq), (ck, mk) = self._lens(q_half), self._lens(k_half)
        return block_backward(dout, q, k, v, out, lse, causal, scale, det, cq, ck, mq, mk)


def _add_rows(acc, layout, part, block):
    """acc[rows of `part`] += block (part: 'all', 'first' or 'second')."""
    if part == "all":
        acc.add_(block)
    elif isinstance(layout, _DenseLayout):
        (layout.first(acc) if part == "first" else layout.second(acc)).add_(block)
    else:
        acc.index_add_(0, layout.i_first if part == "first" else layout.i_second, block.to(acc.dtype))


def _ring_fwd(ring, layout, q, k, v, causal, scale, det):
    kv = (k.contiguous(), v.contiguous())
    out = lse = None
    for step in range(ring.world):
        pending = ring.start(kv, _TAG_KV) if step + 1 < ring.world else None
        kc, vc = kv
        kind = _step_kind(step, causal, ring.rank)
        if step == 0:
            o, l = layout.fwd(q, kc, vc, kind == "diag", scale, det)
            out, lse = o.float(), l.clone()
        elif kind == "full":
            o, l = layout.fwd(q, kc, vc, False, scale, det)
            _merge(out, lse, o, l, layout.lse_seq_dim)
        elif kind == "k_first":
            o, l = layout.fwd(q, layout.first(kc), layout.first(vc), False, scale, det, k_half=True)
            _merge(out, lse, o, l, layout.lse_seq_dim)
        else:  # q_second: merged into the second half's rows
            o, l = layout.fwd(layout.second(q), kc, vc, False, scale, det, q_half=True)
            if isinstance(layout, _DenseLayout):
                _merge(layout.second(out), layout.second_lse(lse), o, l, layout.lse_seq_dim)
            else:
                o2, l2 = layout.second(out), layout.second_lse(lse)
                _merge(o2, l2, o, l, layout.lse_seq_dim)
                out.index_copy_(0, layout.i_second, o2)
                lse.index_copy_(1, layout.i_second, l2)
        if pending is not None:
            kv = tuple(ring.wait(pending))
    return out.to(q.dtype), lse


def _ring_bwd(ring, layout, dout, q, k, v, out, lse, causal, scale, det):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = (k.contiguous(), v.contiguous())
    dkv_pending = None
    dk_acc = dv_acc = None
    for step in range(ring.world):
        last = step + 1 == ring.world
        pending = ring.start(kv, _TAG_KV) if not last else None
        kc, vc = kv
        kind = _step_kind(step, causal, ring.rank)
        if step == 0:
            dk_acc = torch.zeros(kc.shape, dtype=torch.float32, device=kc.device)
            dv_acc = torch.zeros(vc.shape, dtype=torch.float32, device=vc.device)
        else:  # the accumulators that travel with this block
            dk_acc, dv_acc = ring.wait(dkv_pending)
        if kind in ("diag", "full"):
            g = layout.bwd(dout, q, kc, vc, out, lse, kind == "diag", scale, det)
            q_part, k_part = "all", "all"
        elif kind == "k_first":
            g = layout.bwd(dout, q, layout.first(kc), layout.first(vc), out, lse, False, scale, det, k_half=True)
            q_part, k_part = "all", "first"
        else:
            g = layout.bwd(layout.second(dout), layout.second(q), kc, vc, layout.second(out),
                           layout.second_lse(lse), False, scale, det, q_half=True)
            q_part, k_part = "second", "all"
        _add_rows(dq, layout, q_part, g[0])
        _add_rows(dk_acc, layout, k_part, g[1])
        _add_rows(dv_acc, layout, k_part, g[2])
        if ring.world > 1:
            # on to the next rank; after the last step it reaches the block's owner
            dkv_pending = ring.start((dk_acc, dv_acc), _TAG_DKV)
        if pending is not None:
            kv = tuple(ring.wait(pending))
    if ring.world > 1:
        dk_acc, dv_acc = ring.wait(dkv_pending)
    return dq.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, layout, causal, scale, det):
        with torch.no_grad():
            out, lse = _ring_fwd(ring, layout, q, k, v, causal, scale, det)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.layout, ctx.causal, ctx.scale, ctx.det = ring, layout, causal, scale, det
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.no_grad():
            dq, dk, dv = _ring_bwd(ctx.ring, ctx.layout, dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.det)
        return dq, dk, dv, None, None, None, None, None


def _check(q, k, v, group, causal, what):
    ops = _ops()
    ops._check_inputs(q, k, v)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fattn.parallel.%s needs torch.distributed initialised (dist.init_process_group)" % what)
    ring = _Ring(group)
    return ops, ring


def ring_attention(q, k, v, group=None, causal=False, softmax_scale=None, deterministic=False, return_lse=False):
    """Attention over a sequence split across the ranks of `group` (None: the default
    group), each rank calling this with its slice: q [b, s_local, hq, d], k [b, s_local,
    hkv, d], v [b, s_local, hkv, dv] (fattn's layout, GQA by fewer K/V heads), one
    s_local on every rank.  causal=True: the slices must be the zigzag split
    (zigzag_shard; s_local even), and the mask is the whole sequence's causal mask.
    causal=False: any equal split (contiguous_shard).  softmax_scale: None =
    1/sqrt(d).  Differentiable (q, k, v; the backward also goes around the ring, so
    every rank must call backward).  Returns out [b, s_local, hq, dv] in q's dtype,
    and with return_lse=True lse [b, hq, s_local] float32 (the global LSE of the
    local rows, natural log)."""
    _, ring = _check(q, k, v, group, causal, "ring_attention")
    dims = _core.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if dims.sq != dims.sk:
        raise ValueError("fattn.parallel.ring_attention: q has %d local tokens, k %d: every rank holds the same "
                         "slice of queries and keys" % (dims.sq, dims.sk))
    if causal and dims.sq % 2:
        raise ValueError("fattn.parallel.ring_attention: causal=True takes the zigzag split, two equal chunks per "
                         "rank; the local length %d is odd" % dims.sq)
    scale = _core.resolve_scale(softmax_scale, dims.d)
    out, lse = _RingAttention.apply(q, k, v, ring, _DenseLayout(dims.sq), bool(causal), scale, bool(deterministic))
    return (out, lse) if return_lse else out


def ring_attention_varlen(q, k, v, cu_seqlens, max_seqlen, group=None, causal=False, softmax_scale=None,
                          deterministic=False, return_lse=False):
    """ring_attention on a packed batch: q [t_local, hq, d], k, v [t_local, hkv, d(v)],
    the local rows of every sequence packed in order; cu_seqlens (int32 [batch + 1],
    the LOCAL offsets, the same on every rank: each sequence contributes as many rows
    on every rank) and max_seqlen (the longest local sequence).  causal=True: each
    sequence is zigzag-split on its own (zigzag_shard_varlen; every local length
    even); causal=False: any equal split per sequence.  Returns out [t_local, hq, dv],
    and with return_lse=True lse [hq, t_local] float32.  cu_seqlens is read on the host
    once per call (to index the halves of the sequences)."""
    ops, ring = _check(q, k, v, group, causal, "ring_attention_varlen")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("fattn.parallel.ring_attention_varlen: q, k, v must be 3-D [tokens, heads, head_dim]")
    if q.shape[0] != k.shape[0]:
        raise ValueError("fattn.parallel.ring_attention_varlen: q has %d local rows, k %d" % (q.shape[0],
                                                                                             k.shape[0]))
    ops._varlen_shapes(q, k, v, cu_seqlens, cu_seqlens, None, max_seqlen, max_seqlen)
    bounds = _seq_bounds(cu_seqlens)
    if bounds[-1][1] != q.shape[0]:
        raise ValueError("fattn.parallel.ring_attention_varlen: cu_seqlens ends at %d, q has %d rows"
                         % (bounds[-1][1], q.shape[0]))
    if causal and any((b - a) % 2 for a, b in bounds):
        raise ValueError("fattn.parallel.ring_attention_varlen: causal=True takes the zigzag split per sequence; "
                         "every local sequence length must be even")
    scale = _core.resolve_scale(softmax_scale, q.shape[2])
    layout = _VarlenLayout(cu_seqlens, int(max_seqlen))
    out, lse = _RingAttention.apply(q, k, v, ring, layout, bool(causal), scale, bool(deterministic))
    return (out, lse) if return_lse else out
