"""fattn.compat: FlashAttention-2's and -3's module surfaces.  Their signatures against
FA2's flash_attn/flash_attn_interface.py and FA3's hopper/flash_attn_interface.py; the
private block entry points as ring engines call them (ring-flash-attn: FA2's, by keyword
through getfullargspec; TransformerEngine: FA3's, positionally), first on two key blocks
in one process, then in a ring over 2 and 4 gloo processes, dense and packed, causal and
not, against single-process fattn attention; FA2's public functions and their refusals;
install(); fattn.sdpa's kernels on CPU tensors, their schemas against aten's, and the
registration in torch's flash-attention registry.  Needs torch and the library."""
import inspect
import sys
import unittest

import _path  # noqa: F401
import torch
import torch.distributed as dist

import fattn
import fattn.compat
import fattn.compat.flash_attn as F2
import fattn.compat.flash_attn_interface as F3
from fattn.parallel import _Ring

from test_parallel import TOL, inputs, spawn, whole

# The parameter lists of FlashAttention's own functions (name, default or REQ)
REQ = inspect.Parameter.empty
FA2 = {
    "_flash_attn_forward": "q k v dropout_p softmax_scale causal window_size_left window_size_right softcap "
                           "alibi_slopes return_softmax",
    "_flash_attn_backward": "dout q k v out softmax_lse dq dk dv dropout_p softmax_scale causal window_size_left "
                            "window_size_right softcap alibi_slopes deterministic rng_state=None",
    "_flash_attn_varlen_forward": "q k v cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p "
                                  "softmax_scale causal window_size_left=-1 window_size_right=-1 softcap=0.0 "
                                  "alibi_slopes=None return_softmax=False block_table=None leftpad_k=None "
                                  "seqused_k=None zero_tensors=False",
    "_flash_attn_varlen_backward": "dout q k v out softmax_lse dq dk dv cu_seqlens_q cu_seqlens_k max_seqlen_q "
                                   "max_seqlen_k dropout_p softmax_scale causal window_size_left window_size_right "
                                   "softcap alibi_slopes deterministic rng_state=None zero_tensors=False",
    "flash_attn_func": "q k v dropout_p=0.0 softmax_scale=None causal=False window_size=(-1,-1) softcap=0.0 "
                       "alibi_slopes=None deterministic=False return_attn_probs=False",
    "flash_attn_varlen_func": "q k v cu_seqlens_q cu_seqlens_k max_seqlen_q max_seqlen_k dropout_p=0.0 "
                              "softmax_scale=None causal=False window_size=(-1,-1) softcap=0.0 alibi_slopes=None "
                              "deterministic=False return_attn_probs=False block_table=None",
    "flash_attn_with_kvcache": "q k_cache v_cache k=None v=None rotary_cos=None rotary_sin=None cache_seqlens=None "
                               "cache_batch_idx=None cache_leftpad=None block_table=None softmax_scale=None "
                               "causal=False window_size=(-1,-1) softcap=0.0 rotary_interleaved=True "
                               "alibi_slopes=None num_splits=0 return_softmax_lse=False",
}
FA3 = {
    "_flash_attn_forward": "q k v k_new=None v_new=None qv=None out_=None cu_seqlens_q=None cu_seqlens_k=None "
                           "cu_seqlens_k_new=None seqused_q=None seqused_k=None max_seqlen_q=None max_seqlen_k=None "
                           "page_table=None kv_batch_idx=None leftpad_k=None rotary_cos=None rotary_sin=None "
                           "seqlens_rotary=None q_descale=None k_descale=None v_descale=None softmax_scale=None "
                           "causal=False window_size_left=-1 window_size_right=-1 attention_chunk=0 softcap=0.0 "
                           "rotary_interleaved=True scheduler_metadata=None num_splits=1 pack_gqa=None sm_margin=0",
    "_flash_attn_backward": "dout q k v out softmax_lse cu_seqlens_q=None cu_seqlens_k=None sequed_q=None "
                            "sequed_k=None max_seqlen_q=None max_seqlen_k=None dq=None dk=None dv=None "
                            "softmax_scale=None is_causal=False window_size_left=-1 window_size_right=-1 "
                            "softcap=0.0 deterministic=False sm_margin=0",
}


def params(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append(p.name if p.default is REQ else "%s=%s" % (p.name, repr(p.default).replace(" ", "")))
    return " ".join(out)


def default_args(fn):
    """ring-flash-attn's get_default_args: every parameter, None where it has no default."""
    spec = inspect.getfullargspec(fn)
    defaults = spec.defaults or ()
    args = dict(zip(spec.args, (None,) * (len(spec.args) - len(defaults)) + tuple(defaults)))
    if "softcap" in args:
        args["softcap"] = 0.0
    return args


# --- the two calling conventions: (out, lse) forward, in-place backward --------

def fa2_fwd(q, k, v, causal, scale, varlen=None):
    if varlen is None:
        p = default_args(F2._flash_attn_forward)
        fn = F2._flash_attn_forward
    else:
        p = default_args(F2._flash_attn_varlen_forward)
        fn = F2._flash_attn_varlen_forward
        p.update(cu_seqlens_q=varlen[0], cu_seqlens_k=varlen[0], max_seqlen_q=varlen[1], max_seqlen_k=varlen[1])
    p.update(q=q, k=k, v=v, dropout_p=0.0, softmax_scale=scale, causal=causal, alibi_slopes=None,
             return_softmax=False, window_size_left=-1, window_size_right=-1)
    r = fn(**p)
    return r[0], r[1]


def fa2_bwd(dout, q, k, v, out, lse, dq, dk, dv, causal, scale, varlen=None):
    if varlen is None:
        fn = F2._flash_attn_backward
        p = default_args(fn)
    else:
        fn = F2._flash_attn_varlen_backward
        p = default_args(fn)
        p.update(cu_seqlens_q=varlen[0], cu_seqlens_k=varlen[0], max_seqlen_q=varlen[1], max_seqlen_k=varlen[1])
    p.update(dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv, dropout_p=0.0,
             softmax_scale=scale, causal=causal, alibi_slopes=None, deterministic=False, window_size_left=-1,
             window_size_right=-1, rng_state=None)
    fn(**p)


def fa3_fwd(q, k, v, causal, scale, varlen=None):
    cu, mx = varlen if varlen is not None else (None, None)
    r = F3._flash_attn_forward(q, k, v, None, None, None, None, cu, cu, None, None, None, mx, mx, *[None] * 9,
                               causal=causal, softmax_scale=scale, window_size_left=-1,
                               window_size_right=0 if causal else -1)
    return r[0], r[1]


def fa3_bwd(dout, q, k, v, out, lse, dq, dk, dv, causal, scale, varlen=None):
    cu, mx = varlen if varlen is not None else (None, None)
    F3._flash_attn_backward(dout, q, k, v, out, lse, cu, cu, None, None, mx, mx, dq, dk, dv, softmax_scale=scale,
                            is_causal=causal, window_size_left=-1, window_size_right=0 if causal else -1,
                            deterministic=False)


APIS = {"fa2": (fa2_fwd, fa2_bwd), "fa3": (fa3_fwd, fa3_bwd)}


def merge(out, lse, block_out, block_lse, varlen):
    """ring-flash-attn's update_out_and_lse: out float32 [.., s, h, d], lse [.., s, h, 1]."""
    block_lse = (block_lse.transpose(0, 1) if varlen else block_lse.transpose(-2, -1)).unsqueeze(-1)
    if out is None:
        return block_out.float(), block_lse
    out = out - torch.sigmoid(block_lse - lse) * (out - block_out.float())
    lse = lse - torch.nn.functional.logsigmoid(lse - block_lse)
    return out, lse


def ring_engine(api, q, k, v, do, causal, rank, world, varlen=None):
    """A ring as ring-flash-attn's ring_flash_attn_func runs it (contiguous split; causal:
    the diagonal block causal, earlier ranks' blocks full, later ones skipped), through
    the compat entry points only: (out, lse [.., s, h], dq, dk, dv)."""
    fwd, bwd = APIS[api]
    ring = _Ring(None)
    scale = q.shape[-1] ** -0.5
    k, v = k.contiguous(), v.contiguous()
    out = lse = None
    kv = (k, v)
    for step in range(world):
        pend = ring.start(kv, 0) if step + 1 < world else None
        if not causal or step <= rank:
            bo, bl = fwd(q, kv[0], kv[1], causal and step == 0, scale, varlen)
            out, lse = merge(out, lse, bo, bl, varlen is not None)
        if pend is not None:
            kv = tuple(ring.wait(pend))
    o = out.to(q.dtype)
    lse_fa = lse.squeeze(-1).transpose(0, 1).contiguous() if varlen is not None else \
        lse.squeeze(-1).transpose(-2, -1).contiguous()
    dq = torch.zeros(q.shape, dtype=torch.float32)
    bufs = [torch.empty_like(t) for t in (q, k, v)]
    kv, dkv = (k, v), None
    for step in range(world):
        pend = ring.start(kv, 0) if step + 1 < world else None
        if step == 0:
            acc = [torch.zeros(k.shape), torch.zeros(v.shape)]
        else:
            acc = ring.wait(dkv)
        if not causal or step <= rank:
            bwd(do, q, kv[0], kv[1], o, lse_fa, *bufs, causal and step == 0, scale, varlen)
            dq += bufs[0]
            acc[0] += bufs[1]
            acc[1] += bufs[2]
        dkv = ring.start(acc, 2)
        if pend is not None:
            kv = tuple(ring.wait(pend))
    dk, dv = ring.wait(dkv)
    return o, lse_fa, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def ring_cases(rank, world):
    for api in ("fa2", "fa3"):
        for causal in (False, True):
            for dtype in (torch.float32, torch.bfloat16):
                b, s, h, d = 2, 4 * world, 2, 32
                q, k, v, do = inputs((b, s, h, d), (b, s, h, d), dtype, seed=3)
                want = whole(q, k, v, do, causal)
                sl = slice(rank * 4, rank * 4 + 4)
                got = ring_engine(api, *(t[:, sl] for t in (q, k, v, do)), causal, rank, world)
                wants = (want[0][:, sl], want[1][:, :, sl]) + tuple(w[:, sl] for w in want[2:])
                for n, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, wants):
                    torch.testing.assert_close(g.float(), w.float(), **TOL[dtype],
                                               msg=lambda m: "%s ring %d/%d causal=%s %s %s: %s" % (
                                                   api, rank, world, causal, dtype, n, m))
            # packed: three sequences, each split contiguously over the ranks
            lens = [2 * world, 6 * world, 3 * world]
            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
            q, k, v, do = inputs((int(cu[-1]), 2, 16), (int(cu[-1]), 2, 16), torch.float32, seed=5)
            want = whole(q, k, v, do, causal, (cu, max(lens)))
            rows = torch.cat([torch.arange(a + rank * (b - a) // world, a + (rank + 1) * (b - a) // world)
                              for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
            got = ring_engine(api, *(t[rows] for t in (q, k, v, do)), causal, rank, world,
                              ((cu // world).to(torch.int32), max(lens) // world))
            wants = (want[0][rows], want[1][:, rows]) + tuple(w[rows] for w in want[2:])
            for n, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, wants):
                torch.testing.assert_close(g, w, **TOL[torch.float32],
                                           msg=lambda m: "%s varlen ring %d/%d causal=%s %s: %s" % (
                                               api, rank, world, causal, n, m))


class Signatures(unittest.TestCase):
    def test_fa2(self):
        for name, want in FA2.items():
            self.assertEqual(params(getattr(F2, name)), " ".join(want.split()), name)

    def test_fa3(self):
        for name, want in FA3.items():
            self.assertEqual(params(getattr(F3, name)), " ".join(want.split()), name)
        for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
            self.assertIs(getattr(F3, name), getattr(fattn, name))


class Blocks(unittest.TestCase):
    """Two key blocks (non-causal), merged by LSE; the backward of each with the merged O and LSE."""

    def check(self, api, dtype, varlen):
        fwd, bwd = APIS[api]
        if varlen:
            cu = torch.tensor([0, 6, 16, 20], dtype=torch.int32)
            q, k, v, do = inputs((20, 4, 16), (20, 2, 16), dtype)
            want = whole(q, k, v, do, False, (cu, 10))
            # the first half of each sequence's keys, then the second half
            halves = [torch.cat([torch.arange(a, (a + b) // 2) for a, b in ((0, 6), (6, 16), (16, 20))]),
                      torch.cat([torch.arange((a + b) // 2, b) for a, b in ((0, 6), (6, 16), (16, 20))])]
            cuk = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
        else:
            q, k, v, do = inputs((2, 12, 4, 16), (2, 12, 2, 16), dtype)
            want = whole(q, k, v, do, False)
            halves = [torch.arange(0, 6), torch.arange(6, 12)]
        scale = 0.25
        pick = (lambda t, i: t[i]) if varlen else (lambda t, i: t[:, i])
        out = lse = None
        for idx in halves:
            if varlen:  # FA3/FA2 varlen entry points with distinct cu_seqlens_k: through the FA3 form
                r = F3._flash_attn_forward(q, pick(k, idx), pick(v, idx), cu_seqlens_q=cu, cu_seqlens_k=cuk,
                                           max_seqlen_q=10, max_seqlen_k=5, softmax_scale=scale)
                bo, bl = r[0], r[1]
            else:
                bo, bl = fwd(q, pick(k, idx), pick(v, idx), False, scale)
            out, lse = merge(out, lse, bo, bl, varlen)
        o = out.to(dtype)
        lse_fa = lse.squeeze(-1).transpose(0, 1) if varlen else lse.squeeze(-1).transpose(-2, -1)
        tol = TOL[dtype]
        torch.testing.assert_close(o.float(), want[0].float(), **tol)
        torch.testing.assert_close(lse_fa, want[1], **TOL[torch.float32])
        dq = torch.zeros(q.shape)
        dk, dv = torch.zeros(k.shape, dtype=dtype), torch.zeros(v.shape, dtype=dtype)
        for idx in halves:
            bq, bk, bv = torch.empty_like(q), torch.empty_like(pick(k, idx)), torch.empty_like(pick(v, idx))
            if varlen:
                F3._flash_attn_backward(do, q, pick(k, idx), pick(v, idx), o, lse_fa.contiguous(), cu, cuk, None,
                                        None, 10, 5, bq, bk, bv, softmax_scale=scale)
            else:
                bwd(do, q, pick(k, idx), pick(v, idx), o, lse_fa.contiguous(), bq, bk, bv, False, scale)
            dq += bq.float()
            if varlen:
                dk[idx], dv[idx] = bk, bv
            else:
                dk[:, idx], dv[:, idx] = bk, bv
        # whole() uses fattn's default scale 1/sqrt(16) = 0.25: the same
        for n, g, w in (("dq", dq, want[2]), ("dk", dk, want[3]), ("dv", dv, want[4])):
            torch.testing.assert_close(g.float(), w.float(), **tol, msg=lambda m: "%s %s: %s" % (api, n, m))

    def test_blocks(self):
        for api in ("fa2", "fa3"):
            for dtype in (torch.float32, torch.bfloat16):
                with self.subTest(api=api, dtype=dtype):
                    self.check(api, dtype, False)
        self.check("fa3", torch.float32, True)

    def test_refusals(self):
        q = torch.randn(1, 4, 2, 16)
        for kw, msg in ((dict(dropout_p=0.1), "dropout"), (dict(alibi_slopes=torch.ones(2)), "alibi"),
                        (dict(return_softmax=True), "return_softmax"), (dict(softcap=5.0), "softcap"),
                        (dict(window_size_left=3), "window")):
            args = dict(q=q, k=q, v=q, dropout_p=0.0, softmax_scale=None, causal=False, window_size_left=-1,
                        window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False)
            args.update(kw)
            with self.assertRaisesRegex(NotImplementedError, msg):
                F2._flash_attn_forward(**args)
        for kw in (dict(qv=q), dict(page_table=torch.zeros(1, 1, dtype=torch.int32)), dict(attention_chunk=4),
                   dict(q_descale=torch.ones(1))):
            with self.assertRaisesRegex(NotImplementedError, list(kw)[0]):
                F3._flash_attn_forward(q, q, q, **kw)


@unittest.skipUnless(dist.is_available(), "this torch has no torch.distributed")
class Ring(unittest.TestCase):
    def test_two_ranks(self):
        spawn(ring_cases, 2)

    def test_four_ranks(self):
        spawn(ring_cases, 4)


class PublicFA2(unittest.TestCase):
    def test_dropout_is_fa2s_fourth(self):
        q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
        with self.assertRaisesRegex(NotImplementedError, r"dropout_p=0\.1"):
            F2.flash_attn_func(q, k, v, 0.1, None, True)
        with self.assertRaisesRegex(NotImplementedError, "alibi"):
            F2.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2))
        torch.testing.assert_close(F2.flash_attn_func(q, k, v, 0.0, None, True),
                                   fattn.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)
        torch.testing.assert_close(F2.flash_attn_func(q, k, v, 0.0, 0.5),
                                   fattn.flash_attn_func(q, k, v, 0.5), rtol=0, atol=0)
        o, lse, p = F2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        self.assertIsNone(p)
        self.assertEqual(tuple(lse.shape), (1, 2, 8))

    def test_grad(self):
        q, k, v = (torch.randn(2, 8, 2, 16, requires_grad=True) for _ in range(3))
        F2.flash_attn_func(q, k, v, causal=True).sum().backward()
        want = torch.autograd.grad(fattn.flash_attn_func(q, k, v, causal=True).sum(), (q, k, v))
        for g, w in zip((q.grad, k.grad, v.grad), want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)

    def test_varlen_and_kvcache(self):
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        q, k, v = (torch.randn(10, 2, 16) for _ in range(3))
        with self.assertRaisesRegex(NotImplementedError, "dropout"):
            F2.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, 0.5)
        with self.assertRaisesRegex(NotImplementedError, "block_table"):
            F2.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, block_table=torch.zeros(2, 1, dtype=torch.int32))
        torch.testing.assert_close(F2.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, 0.0, None, True),
                                   fattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True), rtol=0, atol=0)
        qd = torch.randn(2, 1, 2, 16)
        kc, vc = torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 16)
        lens = torch.tensor([5, 9], dtype=torch.int32)
        torch.testing.assert_close(F2.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=True),
                                   fattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=True),
                                   rtol=0, atol=0)
        with self.assertRaisesRegex(NotImplementedError, "alibi"):
            F2.flash_attn_with_kvcache(qd, kc, vc, alibi_slopes=torch.ones(2))


class Install(unittest.TestCase):
    def test_install(self):
        names = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn_interface")
        saved = {n: sys.modules.get(n) for n in names}
        try:
            if any(saved.values()):
                with self.assertRaisesRegex(RuntimeError, "already imported"):
                    fattn.compat.install()
            for n in names:
                sys.modules.pop(n, None)
            self.assertEqual(fattn.compat.install(), list(names))
            from flash_attn.flash_attn_interface import _flash_attn_forward as fa2_fwd_
            from flash_attn_interface import _flash_attn_backward as fa3_bwd_
            import flash_attn
            self.assertIs(fa2_fwd_, F2._flash_attn_forward)
            self.assertIs(fa3_bwd_, F3._flash_attn_backward)
            self.assertIs(flash_attn.flash_attn_func, F2.flash_attn_func)
        finally:
            for n, m in saved.items():
                if m is None:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = m


class Sdpa(unittest.TestCase):
    """fattn.sdpa: the kernels it registers, called on CPU tensors (the CPU engine, and
    the float32 composite for what fattn does not serve), their schemas, and the
    registration itself.  The GPU check (SDPA on an H200 running fattn's kernels) is in
    tests/gpu."""

    def test_schemas(self):
        import fattn.sdpa as S
        for op, fn in (("_scaled_dot_product_flash_attention", S.sdpa_flash_forward),
                       ("_scaled_dot_product_flash_attention_backward", S.sdpa_flash_backward),
                       ("_flash_attention_forward", S.flash_forward),
                       ("_flash_attention_backward", S.flash_backward),
                       ("_flash_attention_forward_no_dropout_inplace", S.flash_forward_no_dropout_inplace)):
            if not hasattr(torch.ops.aten, op):
                continue
            schema = getattr(torch.ops.aten, op).default._schema
            want = [(a.name, a.kwarg_only) for a in schema.arguments]
            have = [(p.name, p.kind == p.KEYWORD_ONLY) for p in inspect.signature(fn).parameters.values()]
            self.assertEqual(have[:len(want)], want, op)
            self.assertTrue(all(p.default is not REQ for p in list(inspect.signature(fn).parameters.values())
                                [len(want):]), op)

    def test_sdpa_layout(self):
        import fattn.sdpa as S
        import torch.nn.functional as F
        for causal in (False, True):
            q, k, v, do = (torch.randn(2, 3, 10, 16, requires_grad=True) for _ in range(4))
            want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            wq, wk, wv = torch.autograd.grad(want, (q, k, v), do.detach())
            r = S.sdpa_flash_forward(q.detach(), k.detach(), v.detach(), 0.0, causal)
            self.assertEqual(len(r), 9)
            torch.testing.assert_close(r[0], want.detach(), rtol=1e-5, atol=1e-5)
            s = (q @ k.transpose(-1, -2)).detach() / 4.0
            if causal:
                s = s.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
            torch.testing.assert_close(r[1], torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)
            g = S.sdpa_flash_backward(do.detach(), q.detach(), k.detach(), v.detach(), r[0], r[1], None, None, 10, 10,
                                      0.0, causal, r[6], r[7])
            for a, w in zip(g, (wq, wk, wv)):
                self.assertEqual(a.shape, w.shape)
                torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)
        with self.assertRaisesRegex(NotImplementedError, "dropout"):
            S.sdpa_flash_forward(q.detach(), k.detach(), v.detach(), 0.1, False)

    def test_composite_and_window(self):
        """The fallback: a window (no torch-path backward in fattn) runs the composite; its
        forward matches fattn's windowed forward, its backward torch's autograd of it."""
        import fattn.sdpa as S
        q, k, v, do = inputs((2, 12, 4, 16), (2, 12, 2, 16), torch.float32)
        o, lse, *_ = S.flash_forward(q, k, v, None, None, 12, 12, 0.0, True, False, window_size_left=3,
                                     window_size_right=0)
        want, want_lse = fattn.attention(q, k, v, causal=True, window_size=(3, 0), return_lse=True)
        torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
        qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
        ref = torch.autograd.grad(S.composite_forward(qa, ka, va, True, 0.25, 3, 0)[0], (qa, ka, va), do)
        g = S.flash_backward(do, q, k, v, o, lse, None, None, 12, 12, 0.0, True, None, None, window_size_left=3,
                             window_size_right=0)
        for a, w in zip(g, ref):
            torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)
        # FlashAttention's causal window (-1, 0), as varlen_attn passes it: fattn's causal kernels
        o2 = S.flash_forward(q, k, v, None, None, 12, 12, 0.0, False, False, window_size_left=-1,
                             window_size_right=0)[0]
        torch.testing.assert_close(o2, fattn.attention(q, k, v, causal=True), rtol=0, atol=0)
        # the composite without a window against fattn, forward and backward
        og, lg = S.composite_forward(q, k, v, True, 0.25)
        w = whole(q, k, v, do, True)
        torch.testing.assert_close(og, w[0], rtol=1e-5, atol=1e-5)
        for a, b in zip(S.composite_backward(do, q, k, v, og, lg, True, 0.25), w[2:]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

    def test_varlen(self):
        import fattn.sdpa as S
        cu = torch.tensor([0, 5, 14, 20], dtype=torch.int32)
        q, k, v, do = inputs((20, 4, 16), (20, 2, 16), torch.float32, seed=2)
        for wl, wr in ((None, None), (2, 0)):
            o, lse, *_ = S.flash_forward(q, k, v, cu, cu, 9, 9, 0.0, True, False, window_size_left=wl,
                                         window_size_right=wr)
            g = S.flash_backward(do, q, k, v, o, lse, cu, cu, 9, 9, 0.0, True, None, None, window_size_left=wl,
                                 window_size_right=wr)
            if wl is None:
                want = whole(q, k, v, do, True, (cu, 9))
                got = (o, lse) + tuple(g)
                for a, b in zip(got, want):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            else:  # each sequence alone through the dense windowed forward
                for a, z in ((0, 5), (5, 14), (14, 20)):
                    want = fattn.attention(q[a:z][None], k[a:z][None], v[a:z][None], causal=True,
                                           window_size=(wl, wr))
                    torch.testing.assert_close(o[a:z], want[0], rtol=1e-5, atol=1e-5)
        out = torch.empty(20, 4, 16)
        lse2 = S.flash_forward_no_dropout_inplace(out, q, k, v, cu, cu, 9, 9, 0.0, True, False)
        torch.testing.assert_close(out, whole(q, k, v, do, True, (cu, 9))[0], rtol=1e-5, atol=1e-5)
        self.assertEqual(tuple(lse2.shape), (4, 20))

    def test_registration(self):
        import fattn.sdpa as S
        import torch.nn.attention as att
        if not hasattr(att, "register_flash_attention_impl"):
            with self.assertRaisesRegex(RuntimeError, "no flash-attention registry"):
                S.enable()
            return
        S.enable()
        try:
            self.assertTrue(S.is_enabled())
            self.assertIn(S.NAME, att.list_flash_attention_impls())
            dump = torch._C._dispatch_dump("aten::_scaled_dot_product_flash_attention")
            self.assertTrue(any(line.startswith("CUDA:") and "sdpa.py" in line for line in dump.splitlines()), dump)
        finally:
            S.disable()
        self.assertFalse(S.is_enabled())
        dump = torch._C._dispatch_dump("aten::_scaled_dot_product_flash_attention")
        self.assertFalse(any("sdpa.py" in line for line in dump.splitlines()))
        # a torch without the registry: the call says so
        saved = att.register_flash_attention_impl
        del att.register_flash_attention_impl
        try:
            with self.assertRaisesRegex(RuntimeError, r"no flash-attention registry.*torch >= 2\.9"):
                S.enable()
        finally:
            att.register_flash_attention_impl = saved
