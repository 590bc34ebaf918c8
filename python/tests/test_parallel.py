"""fattn.parallel.ring_attention (and ring_attention_varlen) in 2 and 4 processes on
torch.distributed's gloo backend and the CPU engine: forward (out, LSE) and backward
(dq, dk, dv) of every rank's slice against single-process fattn attention on the whole
sequence, non-causal (contiguous split) and causal (zigzag split), GQA, float32 and
bfloat16.  Needs torch (with torch.distributed) and the library."""
import os
import socket
import sys
import unittest

import _path  # noqa: F401
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fattn
import fattn.parallel as fp

# float32 merges of float32 blocks: the order of the sums differs from one pass
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world, *args):
    """Run fn(rank, world, *args) in `world` processes on gloo; a failure on a rank
    raises here with that rank's traceback."""
    mp.spawn(_entry, args=(world, free_port(), fn, args), nprocs=world, join=True)


def _entry(rank, world, port, fn, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def inputs(shape_q, shape_kv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g).to(dtype)
    k = torch.randn(shape_kv, generator=g).to(dtype)
    v = torch.randn(shape_kv, generator=g).to(dtype)
    do = torch.randn(shape_q[:-1] + (shape_kv[-1],), generator=g).to(dtype)
    return q, k, v, do


def whole(q, k, v, do, causal, varlen=None):
    """Single-process fattn attention on the whole sequence: out, lse, dq, dk, dv."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    if varlen is None:
        o, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    else:
        cu, mx = varlen
        o, lse = fattn.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal, return_attn_probs=True)
    o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


def check_dense(rank, world, causal, dtype, hq, hkv):
    b, s, d = 2, 8 * world, 32
    q, k, v, do = inputs((b, s, hq, d), (b, s, hkv, d), dtype, seed=1 + world)
    want = whole(q, k, v, do, causal)
    shard = (lambda x, dim=1: fp.zigzag_shard(x, rank, world, dim)) if causal else \
        (lambda x, dim=1: fp.contiguous_shard(x, rank, world, dim))
    ql, kl, vl = (shard(t).clone().requires_grad_() for t in (q, k, v))
    o, lse = fp.ring_attention(ql, kl, vl, causal=causal, return_lse=True)
    o.backward(shard(do))
    got = (o.detach(), lse, ql.grad, kl.grad, vl.grad)
    names = ("out", "lse", "dq", "dk", "dv")
    for n, g, w in zip(names, got, (shard(want[0]), shard(want[1], 2), shard(want[2]), shard(want[3]),
                                    shard(want[4]))):
        torch.testing.assert_close(g.float(), w.float(), **TOL[dtype],
                                   msg=lambda m: "rank %d/%d causal=%s %s %s: %s" % (rank, world, causal, dtype,
                                                                                     n, m))
    # the layout helpers invert each other
    parts = [None] * world
    dist.all_gather_object(parts, o.detach())
    torch.testing.assert_close((fp.zigzag_unshard if causal else (lambda p: torch.cat(p, 1)))(parts).float(),
                               want[0].float(), **TOL[dtype])


def check_varlen(rank, world, causal):
    lens = [4 * world, 12 * world, 2 * world]  # each a multiple of 2W
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    t, hq, hkv, d = int(cu[-1]), 4, 2, 16
    q, k, v, do = inputs((t, hq, d), (t, hkv, d), torch.float32, seed=7)
    want = whole(q, k, v, do, causal, (cu, max(lens)))
    if causal:
        shard = lambda x: fp.zigzag_shard_varlen(x, cu, rank, world)  # noqa: E731
    else:  # every sequence's contiguous slice
        shard = lambda x: torch.cat([fp.contiguous_shard(x[a:b], rank, world, 0)  # noqa: E731
                                     for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    cu_l = (cu // world).to(torch.int32)
    ql, kl, vl = (shard(x).clone().requires_grad_() for x in (q, k, v))
    o, lse = fp.ring_attention_varlen(ql, kl, vl, cu_l, max(lens) // world, causal=causal, return_lse=True)
    o.backward(shard(do))
    lse_want = shard(want[1].transpose(0, 1)).transpose(0, 1)
    for n, g, w in zip(("out", "lse", "dq", "dk", "dv"), (o.detach(), lse, ql.grad, kl.grad, vl.grad),
                       (shard(want[0]), lse_want, shard(want[2]), shard(want[3]), shard(want[4]))):
        torch.testing.assert_close(g, w, **TOL[torch.float32],
                                   msg=lambda m: "varlen rank %d/%d causal=%s %s: %s" % (rank, world, causal, n, m))
    if causal:
        parts = [None] * world
        dist.all_gather_object(parts, o.detach())
        torch.testing.assert_close(fp.zigzag_unshard_varlen(parts, cu), want[0], **TOL[torch.float32])


def all_cases(rank, world):
    for causal in (False, True):
        check_dense(rank, world, causal, torch.float32, 4, 2)
        check_varlen(rank, world, causal)
    check_dense(rank, world, True, torch.bfloat16, 2, 2)


@unittest.skipUnless(dist.is_available(), "this torch has no torch.distributed")
class Ring(unittest.TestCase):
    def test_two_ranks(self):
        spawn(all_cases, 2)

    def test_four_ranks(self):
        spawn(all_cases, 4)

    def test_refusals(self):
        q = torch.randn(1, 8, 2, 16)
        with self.assertRaisesRegex(RuntimeError, "init_process_group"):
            fp.ring_attention(q, q, q)
        with self.assertRaisesRegex(ValueError, "multiple of 4"):
            fp.zigzag_shard(torch.randn(1, 6, 2, 16), 0, 2)

    def test_layout_helpers(self):
        x = torch.arange(16).view(1, 16, 1, 1)
        parts = [fp.zigzag_shard(x, r, 4) for r in range(4)]
        self.assertEqual(parts[0].flatten().tolist(), [0, 1, 14, 15])
        self.assertEqual(parts[3].flatten().tolist(), [6, 7, 8, 9])
        self.assertTrue(torch.equal(fp.zigzag_unshard(parts), x))


if __name__ == "__main__":
    if not dist.is_available():
        print("SKIP: this torch has no torch.distributed")
        sys.exit(77)
    unittest.main()
