"""_chunk.py - FlashAttention-3's attention_chunk (Llama 4's chunked attention) as a variable-length call.

Query i of a sequence, at position p = i + len_k - len_q on the keys (bottom-right aligned), sees only
the keys of its chunk, c0 <= j < c0 + C with c0 = p - p mod C (floor: p < 0 sees none), intersected with
causal and the window.  Both the queries and the keys of a sequence fall into consecutive runs by chunk,
so the call is the same call on a finer variable-length batch: sequence b becomes N = ceil(max_k / C) + 1
sub-sequences (c = -1 for the rows with p < 0, then chunks 0 .. N - 2), sub-sequence (b, c) holding the
queries of chunk c and the keys of chunk c, in their packed rows.  Causal and window alignment carry over:
a sub-sequence's keys end (kb) and queries end (qb) differ by len_k - len_q of its sequence, so key minus
query positions are unchanged.  Out and LSE rows are the same rows in the same order: nothing moves but
cu_seqlens (built on the device, no host synchronisation).  Empty sub-sequences cost the kernels a tile
each and nothing else."""
import torch

__all__ = ["chunk_count", "split_rows", "varlen_split", "cache_split"]


def chunk_count(max_k, chunk):
    """N, the sub-sequences per sequence: chunk -1 (queries before the keys) and ceil(max_k / chunk)."""
    return -(-max(int(max_k), 0) // chunk) + 1


def split_rows(lens_q, lens_k, chunk, n):
    """For sequences of lens_q queries and lens_k keys (int tensors [b] on one device): the ends of
    each sub-sequence's queries and keys within its sequence, qb and kb [b, n] (int64), and their
    starts qa, ka (the previous ends, 0 first).  The last qb is lens_q and the last kb lens_k."""
    lq, lk = lens_q.long()[:, None], lens_k.long()[:, None]
    c1 = torch.arange(n, device=lens_q.device, dtype=torch.long)[None] * chunk  # (c + 1) C, c = -1 .. n - 2
    zero = torch.zeros_like(lq)
    qb = torch.minimum(torch.maximum(c1 - (lk - lq), zero), lq)
    kb = torch.minimum(c1, lk)
    qa = torch.cat([zero, qb[:, :-1]], 1)
    ka = torch.cat([zero, kb[:, :-1]], 1)
    return qa, qb, ka, kb


def packed_cu(cu, starts):
    """cu_seqlens of the sub-sequences: sequence b's rows from cu[b] split at cu[b] + starts[b, 1:],
    ending at cu[b + 1] (int32 [b n + 1])."""
    return torch.cat([(cu[:-1].long()[:, None] + starts).flatten(), cu[-1:].long()]).to(torch.int32)


def varlen_split(cu_q, cu_k, seqused_q, seqused_k, max_k, chunk):
    """The finer varlen batch of a packed call: (cu_q, cu_k, seqused_q, seqused_k, max_k) of the
    sub-sequences.  With seqused_*, each sub-sequence's used rows are its share of the used rows."""
    lq = cu_q[1:] - cu_q[:-1]
    lk = cu_k[1:] - cu_k[:-1]
    if seqused_q is not None:
        lq = torch.minimum(lq, seqused_q.clamp_min(0))
    if seqused_k is not None:
        lk = torch.minimum(lk, seqused_k.clamp_min(0))
    n = chunk_count(max_k, chunk)
    qa, qb, ka, kb = split_rows(lq, lk, chunk, n)
    # a sequence's last sub-sequence ends at its last packed row: past its used rows, which seqused cuts
    uq = None if seqused_q is None else (qb - qa).flatten().to(torch.int32)
    uk = None if seqused_k is None else (kb - ka).flatten().to(torch.int32)
    return packed_cu(cu_q, qa), packed_cu(cu_k, ka), uq, uk, min(int(max_k), chunk)


def cache_split(cu_q, lens_k, leftpad, chunk, max_k):
    """The finer batch of varlen queries on a KV cache: sequence b's keys are cache rows leftpad[b] ..
    leftpad[b] + lens_k[b] - 1.  Returns (cu_q, seqused_k, cache_leftpad, n): sub-sequence (b, c)'s
    keys are rows cache_leftpad .. seqused_k - 1 of sequence b's cache row (the caller repeats its
    batch index or page-table row n times)."""
    lq = cu_q[1:] - cu_q[:-1]
    n = chunk_count(max_k, chunk)
    qa, _, ka, kb = split_rows(lq, lens_k, chunk, n)
    lp = torch.zeros_like(lens_k).long() if leftpad is None else leftpad.long().clamp_min(0)
    return (packed_cu(cu_q, qa), (lp[:, None] + kb).flatten().to(torch.int32),
            (lp[:, None] + ka).flatten().to(torch.int32), n)
