"""fattn on torch tensors: the forward and its gradients (CPU engine) against float64
references, the custom ops (opcheck, torch.compile(fullgraph=True)), flash_attn_func's
FlashAttention-3 signature, flash_attn_with_kvcache (decoding on contiguous and paged KV
caches), flash_attn_varlen_func (packed variable-length batches), and every kind of bad
argument.  CUDA cases run on a Hopper GPU and skip
elsewhere; class CudaPortable runs on the portable engine (any other GPU from sm_80 on, or an H200
with FATTN_CUDA_ENGINE=portable: ctest python_torch_portable).  Needs torch and the library."""
import itertools
import math
import os
import shutil
import subprocess
import sys
import unittest
import warnings

import _path  # noqa: F401
import torch
import torch.nn.functional as F

import fattn

HERE = os.path.dirname(os.path.abspath(__file__))
# Which CUDA engine the shared contexts run (fattn.h, fattn_ctx_create): Hopper's on sm_90 unless
# FATTN_CUDA_ENGINE=portable forces the portable one, which every other GPU from sm_80 on runs.
_ENGINE_ENV = os.environ.get("FATTN_CUDA_ENGINE", "")
_SM80 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
HOPPER = _SM80 and torch.cuda.get_device_capability() == (9, 0) and _ENGINE_ENV != "portable"
PORTABLE = _SM80 and not HOPPER and _ENGINE_ENV != "hopper"


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, sink=None, return_lse=False, chunk=0):
    """Softmax attention in the inputs' dtype, FlashAttention's bottom-right causal mask
    and window (rows that see no key give 0), softcap and FA4's sinks (fattn.h: one more
    softmax column per query head, no value row; lse includes it), FA3's attention_chunk
    (its construct_chunk_mask: query i at p = i + sk - sq sees keys c0 <= j < c0 + chunk,
    c0 = p - p mod chunk, floor); differentiable."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(hq // hkv, 2)
    v = v.repeat_interleave(hq // hkv, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    hide = torch.zeros(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        hide |= j > i + sk - sq
    if window[1] >= 0:
        hide |= j > i + sk - sq + window[1]
    if window[0] >= 0:
        hide |= j < i + sk - sq - window[0]
    if chunk:
        c0 = i + sk - sq - torch.remainder(i + sk - sq, chunk)
        hide |= (j < c0) | (j >= c0 + chunk)
    s = s.masked_fill(hide, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.to(s.dtype).view(1, hq, 1, 1).expand(b, hq, sq, 1)], -1)
    lse = torch.logsumexp(s, -1)
    # rows that see no key (and no sink): 0, through a softmax of zeros so that no NaN reaches a gradient
    empty = torch.isneginf(lse.detach())[..., None]
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)[..., :sk]
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return (o, lse) if return_lse else o


def sdpa(q, k, v, causal=False):
    """torch's own SDPA on [b, s, h, d] (a peer for 16-bit accuracy); square causal only."""
    hq, hkv = q.shape[2], k.shape[2]
    k, v = (x.repeat_interleave(hq // hkv, 2) for x in (k, v))
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return o.transpose(1, 2)


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def inputs(b=2, sq=37, sk=45, hq=4, hkv=2, d=16, dv=None, dtype=torch.float32, device="cpu", grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    ts = [torch.randn(s, generator=g).to(device=device, dtype=dtype)
          for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, dv))]
    return [t.requires_grad_(grad) for t in ts]


def grads(fn, q, k, v, dout):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = fn(q, k, v)
    return (o,) + torch.autograd.grad(o, (q, k, v), dout)


SHAPES = [dict(), dict(hq=6, hkv=1), dict(sq=50, sk=20), dict(sq=20, sk=50), dict(d=24, dv=40),
          dict(b=1, sq=1, sk=1, hq=1, hkv=1)]


class Forward(unittest.TestCase):
    def test_matches_reference(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
            for causal in (False, True):
                for shape in SHAPES:
                    q, k, v = inputs(dtype=dtype, **shape)
                    o, lse = fattn.attention(q, k, v, causal=causal, return_lse=True)
                    r = reference(q.double(), k.double(), v.double(), causal)
                    self.assertEqual(o.dtype, dtype)
                    self.assertEqual(o.shape, r.shape)
                    self.assertEqual((lse.dtype, tuple(lse.shape)), (torch.float32, (q.shape[0], q.shape[2], q.shape[1])))
                    self.assertLess(rel(o, r), tol, (dtype, causal, shape))

    def test_lse(self):
        q, k, v = inputs(sq=10, sk=6)
        _, lse = fattn.attention(q, k, v, causal=True, return_lse=True)
        s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(2, 2)) / 4.0
        i, j = torch.arange(10)[:, None], torch.arange(6)[None, :]
        ref = s.masked_fill(j > i - 4, float("-inf")).logsumexp(-1)
        fin = torch.isfinite(ref)
        self.assertTrue(torch.equal(torch.isfinite(lse), fin))
        torch.testing.assert_close(lse[fin].double(), ref[fin], rtol=1e-5, atol=1e-5)

    def test_layouts(self):
        q, k, v = inputs()
        r = reference(q.double(), k.double(), v.double())
        bhsd = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
        self.assertLess(rel(fattn.attention(*bhsd), r), 1e-5)
        qt = q.transpose(2, 3).contiguous().transpose(2, 3)  # head dim not contiguous: copied
        self.assertLess(rel(fattn.attention(qt, k, v), r), 1e-5)
        kx, vx = k[:, :, :1].expand_as(k), v[:, :, :1].expand_as(v)  # stride 0 along heads
        self.assertLess(rel(fattn.attention(q, kx, vx), reference(q.double(), kx.double(), vx.double())), 1e-5)
        qkv = torch.randn(2, 37, 3, 4, 16)
        qp, kp, vp = qkv.unbind(2)  # one packed buffer
        self.assertLess(rel(fattn.attention(qp, kp, vp), reference(qp.double(), kp.double(), vp.double())), 1e-5)

    def test_out_and_ctx(self):
        q, k, v = inputs()
        out = torch.empty(2, 37, 4, 16)
        self.assertIs(fattn.attention(q, k, v, out=out), out)
        self.assertLess(rel(out, reference(q.double(), k.double(), v.double())), 1e-5)
        ctx = fattn.Context(fattn.BACKEND_CPU)
        ctx.set_threads(1)
        self.assertTrue(torch.equal(fattn.attention(q, k, v, ctx=ctx), out))  # thread count changes no bit
        # each was written past its storage or with the wrong element size
        for bad in (torch.empty(2, 37, 4, 16, dtype=torch.float16), torch.empty(2, 37, 4, 8),
                    torch.empty(2, 37, 4, 32)[..., ::2], torch.empty(37 * 16 * 2).as_strided((2, 37, 4, 16),
                                                                                            (37 * 16, 16, 0, 1)),
                    torch.empty(2, 37, 4, 16, device="meta")):
            with self.assertRaises(ValueError):
                fattn.attention(q, k, v, out=bad)
        with self.assertRaises(RuntimeError):  # out= is outside autograd
            fattn.attention(*inputs(grad=True), out=out)

    def test_fp8(self):
        q, k, v = inputs(d=64, sq=200, sk=200)
        o = fattn.attention(q, k, v, causal=True, fp8=True)
        self.assertEqual(o.dtype, torch.float32)
        self.assertLess(rel(o, reference(q.double(), k.double(), v.double(), True)), 7e-2)  # test_numpy: why 7e-2
        with self.assertRaises(NotImplementedError):
            fattn.attention(*inputs(grad=True), fp8=True)
        with torch.no_grad():
            fattn.attention(*inputs(grad=True), fp8=True)

    def test_empty(self):
        q, k, v = inputs(sk=0, grad=True)
        o, lse = fattn.attention(q, k, v, return_lse=True)
        self.assertTrue(bool((o == 0).all()) and bool(torch.isneginf(lse).all()))
        o.sum().backward()
        self.assertTrue(bool((q.grad == 0).all()))
        self.assertEqual(fattn.attention(*inputs(b=0)).shape, (0, 37, 4, 16))


def quantize_then_fwd(q, k, v, causal=False, cfg=None, scale=None):
    """fattn_fwd_fp8's result by hand through _capi: fattn_quantize of q, k and v
    into packed BSHD e4m3 (per tensor: blocks of 128 rows, as fattn.h says), then
    fattn_fwd on the e4m3 tensors with o in q's dtype.  CPU tensors."""
    from fattn import _capi, _core
    cfg = cfg or fattn.FP8()
    ctx = _core.context(_core.BACKEND_CPU)
    dims = _core.check_shapes(q.shape, k.shape, v.shape)
    tensor = cfg.granularity == "tensor"
    blocks = (128, 128, 128) if tensor else (cfg.block_q, cfg.block_k, cfg.block_v)
    keep, coded = [], []
    for x, name, blk, rot in ((q, "q", blocks[0], cfg.rotate), (k, "k", blocks[1], cfg.rotate),
                              (v, "v", blocks[2], False)):
        x = x.contiguous()
        b, s, h, d = x.shape
        codes = torch.empty(b, s, h, d, dtype=torch.uint8)
        scales = torch.empty(b, h, (s + blk - 1) // blk, dtype=torch.float32)
        keep += [x, codes, scales]
        qa = _capi.QuantizeArgs()
        setattr(qa, "in", _core.tensor_struct(_core.describe(x, name)))
        qa.out = _capi.Tensor(codes.data_ptr(), _core.E4M3, 0, 0, 0, scales.data_ptr(), blk)
        qa.batch, qa.seqlen, qa.heads, qa.head_dim = b, s, h, d
        qa.granularity = _core.QUANT_TENSOR if tensor else _core.QUANT_BLOCK
        qa.block_rows, qa.rotate, qa.seed = blk, int(rot), cfg.seed
        ctx.quantize_raw(qa)
        coded.append(_capi.Tensor(codes.data_ptr(), _core.E4M3, 0, 0, 0, scales.data_ptr(), blk))
    o = torch.empty(dims.o_shape, dtype=q.dtype)
    lse = torch.empty(dims.lse_shape, dtype=torch.float32)
    a = _capi.FwdArgs()
    a.p = _core.problem(dims, causal, _core.resolve_scale(scale, dims.d))
    a.q, a.k, a.v = coded
    a.o = _core.tensor_struct(_core.describe(o, "o"))
    a.lse = lse.data_ptr()
    ctx.fwd_raw(a)
    return o, lse


# FP8 settings the tests sweep: fp8=True's defaults, rotation, one scale per key,
# odd block sizes (the CPU engine serves any), per tensor.
FP8_CONFIGS = [True, fattn.FP8(), fattn.FP8(rotate=True, seed=7), fattn.FP8(block_k=1),
               fattn.FP8(block_k=1, rotate=True, seed=2 ** 64 - 1), fattn.FP8(block_q=64, block_k=32, block_v=256),
               fattn.FP8(block_q=1, block_k=3, block_v=5), fattn.FP8(granularity="tensor"),
               fattn.FP8(granularity="tensor", rotate=True, seed=3)]


class Fp8(unittest.TestCase):
    """fattn.attention(fp8=...) on CPU tensors: fattn_fwd_fp8's bits are those of
    fattn_quantize + fattn_fwd on e4m3 done by hand, and close to the 16-bit result."""

    def test_bitwise_quantize_then_fwd(self):
        for dtype in (torch.bfloat16, torch.float32):
            for shape in (dict(sq=150, sk=300, hq=4, hkv=2, d=64), dict(sq=40, sk=20, hq=6, hkv=1, d=32, dv=16)):
                q, k, v = inputs(dtype=dtype, **shape)
                for causal in (False, True):
                    for fp8 in FP8_CONFIGS:
                        o, lse = fattn.attention(q, k, v, causal=causal, fp8=fp8, return_lse=True)
                        cfg = fattn.FP8() if fp8 is True else fp8
                        ro, rlse = quantize_then_fwd(q, k, v, causal, cfg)
                        msg = (dtype, shape, causal, fp8)
                        self.assertEqual(o.dtype, dtype, msg)
                        self.assertTrue(torch.equal(o.view(torch.int16 if dtype != torch.float32 else torch.int32),
                                                    ro.view(torch.int16 if dtype != torch.float32 else torch.int32)),
                                        msg)
                        self.assertTrue(torch.equal(lse, rlse), msg)

    def test_close_to_16bit(self):
        # e4m3 keeps 3 mantissa bits: O against the same attention without FP8 has a
        # relative (Frobenius) error of 4.0-4.8e-2 on these N(0, 1) inputs (bf16 and f32,
        # both masks, GQA, every FP8_CONFIGS entry; test_numpy.test_fp8 says why it is
        # not ~2-3e-2: V's rounding is averaged no better than V is); 7e-2 leaves a
        # margin, garbage would be ~1
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v = inputs(dtype=dtype, sq=256, sk=256, hq=4, hkv=2, d=64, seed=1)
            for causal in (False, True):
                want = fattn.attention(q, k, v, causal=causal)
                errs = {}
                for fp8 in FP8_CONFIGS:
                    o = fattn.attention(q, k, v, causal=causal, fp8=fp8)
                    errs[repr(fp8)] = rel(o, want)
                    self.assertLess(errs[repr(fp8)], 7e-2, (dtype, causal, fp8))
                self.assertGreater(min(errs.values()), 1e-3, "fp8 did not quantise")

    def test_rotation_changes_the_codes_not_the_math(self):
        q, k, v = inputs(sq=128, sk=128, d=64, dtype=torch.bfloat16)
        plain = fattn.attention(q, k, v, fp8=fattn.FP8())
        rot = [fattn.attention(q, k, v, fp8=fattn.FP8(rotate=True, seed=s)) for s in (0, 1)]
        self.assertFalse(torch.equal(plain, rot[0]))
        self.assertFalse(torch.equal(rot[0], rot[1]))  # the seed picks the signs
        self.assertTrue(torch.equal(rot[0], fattn.attention(q, k, v, fp8=fattn.FP8(rotate=True, seed=0))))
        want = fattn.attention(q, k, v)
        for o in [plain] + rot:
            self.assertLess(rel(o, want), 7e-2)
        self.assertTrue(torch.equal(fattn.attention(q, k, v, fp8=True), plain))  # True is FP8()
        self.assertTrue(torch.equal(fattn.attention(q, k, v, fp8=False), want))  # False and None: off
        self.assertTrue(torch.equal(fattn.attention(q, k, v, fp8=None), want))

    def test_softmax_scale_layouts_out_ctx(self):
        q, k, v = inputs(d=64, dtype=torch.bfloat16)
        cfg = fattn.FP8(block_k=1)
        ro, _ = quantize_then_fwd(q, k, v, True, cfg, scale=0.2)
        self.assertTrue(torch.equal(fattn.attention(q, k, v, True, 0.2, fp8=cfg), ro))
        bhsd = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
        self.assertTrue(torch.equal(fattn.attention(*bhsd, causal=True, softmax_scale=0.2, fp8=cfg), ro))
        out = torch.empty_like(ro)
        ctx = fattn.Context(fattn.BACKEND_CPU)
        self.assertIs(fattn.attention(q, k, v, True, 0.2, fp8=cfg, out=out, ctx=ctx), out)
        self.assertTrue(torch.equal(out, ro))
        o = fattn.attention(*inputs(sk=0), fp8=True)  # no key: 0, nothing quantised
        self.assertTrue(bool((o == 0).all()))

    def test_autograd_refused(self):
        for grad_of in range(3):
            ts = inputs(d=32)
            ts[grad_of].requires_grad_(True)
            for fp8 in (True, fattn.FP8(rotate=True)):
                with self.assertRaises(ValueError) as cm:  # also a NotImplementedError, as before
                    fattn.attention(*ts, fp8=fp8)
                self.assertIsInstance(cm.exception, NotImplementedError)
                self.assertIn("fp8", str(cm.exception))
                self.assertIn("backward of FP8 attention is not implemented", str(cm.exception))
            with self.assertRaises(ValueError):
                fattn.attention(*ts, fp8=True, out=torch.empty(2, 37, 4, 32))
        ts = inputs(d=32, grad=True)
        with torch.no_grad():  # grad mode off: served
            o = fattn.attention(*ts, fp8=True)
        self.assertFalse(o.requires_grad)
        # the op called directly: its backward raises, never a wrong gradient
        o, _ = torch.ops.fattn.fwd_fp8(*ts, False, 0.25, "block", 128, 128, 128, False, 0)
        with self.assertRaises(NotImplementedError) as cm:
            o.sum().backward()
        self.assertIn("backward of FP8 attention is not implemented", str(cm.exception))
        self.assertIsNone(ts[0].grad)
        o, _ = torch.ops.fattn.fwd(*ts, False, 0.25, True, False)  # fwd's fp8 flag too
        with self.assertRaises(NotImplementedError):
            o.sum().backward()

    def test_bad_options(self):
        for kw in (dict(granularity="row"), dict(granularity=0), dict(block_q=0), dict(block_k=-1),
                   dict(block_v=2 ** 31), dict(seed=-1), dict(seed=2 ** 64), dict(seed=1.5)):
            with self.assertRaises(ValueError, msg=str(kw)):
                fattn.FP8(**kw)
        for kw in (dict(block_q=1.5), dict(block_k="128"), dict(block_v=True), dict(rotate=1), dict(rotate="yes")):
            with self.assertRaises(TypeError, msg=str(kw)):
                fattn.FP8(**kw)
        q, k, v = inputs(d=24)
        for bad in ("block", 1, 128, dict(block_k=1), "tensor"):
            with self.assertRaises(TypeError, msg=repr(bad)):
                fattn.attention(q, k, v, fp8=bad)
        with self.assertRaises(fattn.FattnUnsupportedError) as cm:  # the library's refusal and message
            fattn.attention(q, k, v, fp8=fattn.FP8(rotate=True))
        self.assertIn("power-of-two head_dim", str(cm.exception))
        self.assertIn("fattn_fwd_fp8", str(cm.exception))
        with self.assertRaises(TypeError):  # fp8 takes 16-bit and f32 inputs, not float64
            fattn.attention(q.double(), k.double(), v.double(), fp8=True)

    def test_opcheck(self):
        q, k, v = inputs(b=1, sq=7, sk=9, d=32)
        for args in ((q, k, v, True, 0.3, "block", 128, 1, 128, True, 5),
                     (q, k, v, False, 0.3, "tensor", 128, 128, 128, False, -1)):
            for name, res in torch.library.opcheck(torch.ops.fattn.fwd_fp8.default, args).items():
                self.assertEqual(res, "SUCCESS", name)
        # a seed >= 2**63 travels as its two's complement
        a = torch.ops.fattn.fwd_fp8(q, k, v, False, 0.3, "block", 128, 128, 128, True, -1)[0]
        b = fattn.attention(q, k, v, softmax_scale=0.3, fp8=fattn.FP8(rotate=True, seed=2 ** 64 - 1))
        self.assertTrue(torch.equal(a, b))

    def test_compile(self):
        cfg = fattn.FP8(block_k=1, rotate=True, seed=9)
        q, k, v = inputs(d=32, dtype=torch.bfloat16)

        def f(q, k, v):
            return fattn.attention(q, k, v, causal=True, fp8=cfg) * 2

        want = f(q, k, v)
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
        self.assertTrue(torch.equal(got, want))
        torch._dynamo.reset()
        m = torch.compile(lambda q, k, v: fattn.attention(q, k, v, fp8=True), fullgraph=True, backend="aot_eager")
        self.assertTrue(torch.equal(m(q, k, v), fattn.attention(q, k, v, fp8=True)))


class Backward(unittest.TestCase):
    def test_f32_against_float64(self):
        # No f64 in the engine (fattn_dtype: f32, f16, bf16, e4m3), so no gradcheck in
        # float64: fattn's f32 gradients must be within 2x the error of the same reference
        # computed by torch in f32, both measured against float64 (relative Frobenius norm).
        for causal in (False, True):
            for shape in SHAPES:
                q, k, v = inputs(**shape)
                dout = torch.randn(q.shape[:3] + (v.shape[3],), generator=torch.Generator().manual_seed(5))
                want = grads(lambda a, b, c: reference(a, b, c, causal), q.double(), k.double(), v.double(),
                             dout.double())
                peer = grads(lambda a, b, c: reference(a, b, c, causal), q, k, v, dout)
                got = grads(lambda a, b, c: fattn.attention(a, b, c, causal=causal), q, k, v, dout)
                for name, g, p, w in zip(("o", "dq", "dk", "dv"), got, peer, want):
                    self.assertEqual(g.dtype, torch.float32)
                    # absolute norms: with one key dq is exactly 0 and only rounding is left, of the size
                    # of dout's terms (measured: fattn 1.1-1.5x torch's f32 error, both ~2e-7 relative;
                    # 1.04e-6 absolute for dq at one key, where 1e-6 floored the bound before dout was seeded)
                    err, peer_err = (g.double() - w).norm().item(), (p.double() - w).norm().item()
                    floor = 1e-6 * max(w.norm().item(), dout.norm().item(), 1.0)
                    self.assertLessEqual(err, 2 * peer_err + floor, (name, causal, shape))

    def test_16bit_against_sdpa(self):
        # 16-bit: within 2x the error of torch's SDPA on the same 16-bit inputs (measured:
        # fattn 0.5-0.8x SDPA's, e.g. bf16 dk 1.6e-3 against 3.4e-3; inputs are seeded)
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                q, k, v = inputs(dtype=dtype, sk=37, hkv=4 if causal else 2)
                dout = torch.randn(q.shape, dtype=dtype)
                want = grads(lambda a, b, c: reference(a, b, c, causal), q.double(), k.double(), v.double(),
                             dout.double())
                peer = grads(lambda a, b, c: sdpa(a, b, c, causal), q, k, v, dout)
                got = grads(lambda a, b, c: fattn.attention(a, b, c, causal=causal), q, k, v, dout)
                for name, g, p, w in zip(("o", "dq", "dk", "dv"), got, peer, want):
                    self.assertEqual(g.dtype, dtype)
                    self.assertLessEqual(rel(g, w), 2 * rel(p, w), (name, dtype, causal))

    def test_gradcheck_f32(self):
        # Finite differences of fattn's own forward: central differences with eps 1e-2 in f32
        # have truncation error ~eps^2 |f'''| ~ 1e-4 and rounding error ~ 6e-8 / eps ~ 6e-6,
        # so atol = rtol = 5e-3 leaves a margin of ~50x and still catches a wrong term.
        q, k, v = inputs(b=1, sq=5, sk=6, hq=2, hkv=1, d=4, dv=3, grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "inputs are not double precision"
            for causal in (False, True):
                self.assertTrue(torch.autograd.gradcheck(lambda a, b, c: fattn.attention(a, b, c, causal=causal),
                                                         (q, k, v), eps=1e-2, atol=5e-3, rtol=5e-3))

    def test_lse_has_no_gradient(self):
        q, k, v = inputs(grad=True)
        o, lse = fattn.attention(q, k, v, return_lse=True)
        self.assertTrue(o.requires_grad)
        self.assertFalse(lse.requires_grad)
        (o.sum() + lse.sum()).backward()  # lse counts as a constant
        self.assertIsNotNone(q.grad)

    def test_deterministic(self):
        q, k, v = inputs(sq=100, sk=100)
        dout = torch.randn(q.shape)
        a = grads(lambda x, y, z: fattn.flash_attn_func(x, y, z, causal=True, deterministic=True), q, k, v, dout)
        b = grads(lambda x, y, z: fattn.flash_attn_func(x, y, z, causal=True, deterministic=True), q, k, v, dout)
        for x, y in zip(a, b):
            self.assertTrue(torch.equal(x, y))

    def test_opcheck(self):
        q, k, v = inputs(b=1, sq=7, sk=9, grad=True)
        args = (q, k, v, True, 0.3, False, False)
        for name, res in torch.library.opcheck(torch.ops.fattn.fwd.default, args).items():
            self.assertEqual(res, "SUCCESS", name)
        o, lse = torch.ops.fattn.fwd(*args)
        bargs = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse, True, 0.3, False)
        for name, res in torch.library.opcheck(torch.ops.fattn.bwd.default, bargs).items():
            self.assertEqual(res, "SUCCESS", name)


class Block(torch.nn.Module):
    """A small attention block: qkv projection, fattn (GQA), output projection."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.d)
        k, v = self.kv(x).view(b, n, 2, self.hkv, self.d).unbind(2)
        return self.o(fattn.attention(q, k, v, causal=True).reshape(b, n, -1))


def _have_cxx():
    return any(shutil.which(c) for c in ("c++", "g++", "clang++"))


class Compile(unittest.TestCase):
    def check(self, backend):
        torch.manual_seed(0)
        m = Block()
        x = torch.randn(2, 16, 32)
        ref = m(x)
        ref.sum().backward()
        want = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        torch._dynamo.reset()
        cm = torch.compile(m, fullgraph=True, backend=backend)  # fullgraph: a graph break is an error
        y = cm(x)
        y.sum().backward()
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        for p, w in zip(m.parameters(), want):
            torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-5)

    def test_aot_eager(self):
        self.check("aot_eager")  # dynamo + AOTAutograd: the fake ops and the autograd formula

    @unittest.skipUnless(_have_cxx(), "inductor's CPU code needs a C++ compiler")
    def test_inductor(self):
        self.check("inductor")

    def test_fattn_imported_before_torch(self):
        # the ops are registered when torch's import finishes, not at the first call
        # (which dynamo could not trace)
        code = ("import fattn, torch\n"
                "f = torch.compile(lambda q: fattn.attention(q, q, q, causal=True).sum(), fullgraph=True,"
                " backend='aot_eager')\n"
                "print(float(f(torch.randn(1, 8, 2, 16))))\n")
        env = dict(os.environ)
        if not os.environ.get("FATTN_TEST_INSTALLED"):
            env["PYTHONPATH"] = os.path.join(HERE, "..")
        r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])


class FlashAttnFunc(unittest.TestCase):
    def test_same_as_attention(self):
        q, k, v = inputs()
        o, lse = fattn.attention(q, k, v, causal=True, softmax_scale=0.2, return_lse=True)
        self.assertTrue(torch.equal(fattn.flash_attn_func(q, k, v, softmax_scale=0.2, causal=True), o))
        o2, lse2 = fattn.flash_attn_func(q, k, v, 0.2, True, return_attn_probs=True)
        self.assertTrue(torch.equal(o2, o) and torch.equal(lse2, lse))
        self.assertTrue(torch.equal(fattn.flash_attn_func(q, k, v, 0.2, window_size=(-1, 0)), o))  # = causal
        for hint in (dict(num_splits=0), dict(num_splits=1), dict(num_splits=3), dict(pack_gqa=True),
                     dict(pack_gqa=False),
                     dict(deterministic=True), dict(window_size=[-1, -1])):
            self.assertTrue(torch.equal(fattn.flash_attn_func(q, k, v, 0.2, True, **hint), o), hint)

    def test_unsupported_arguments_raise(self):
        q, k, v = inputs()
        for bad in (dict(qv=q), dict(q_descale=torch.ones(2, 2)), dict(k_descale=torch.ones(2, 2)),
                    dict(v_descale=torch.ones(2, 2)), dict(sm_margin=8)):
            with self.assertRaises(NotImplementedError, msg=str(bad)):
                fattn.flash_attn_func(q, k, v, **bad)

    def test_e4m3_with_descales(self):
        # FA3's FP8 call: float8_e4m3fn q, k, v with float32 [b, hkv] descales, bf16 out, against
        # attention on the dequantised values in float64.  Bound 2e-2: bf16 output (2^-9) and, on
        # the CUDA kernel, P rounded to e4m3 (2^-4 an element, averaged over the keys of a row);
        # a descale read for the wrong head or batch entry moves the output by far more.
        torch.manual_seed(3)
        b, sq, sk, hq, hkv, d = 2, 37, 70, 4, 2, 32
        g = hq // hkv
        def head_quant(x, heads):  # one scale per (batch entry, kv head)
            xg = x.view(x.shape[0], x.shape[1], heads, -1, x.shape[-1])
            ds = (xg.abs().amax(dim=(1, 3, 4)) / 448).clamp_min(2 ** -126) * torch.tensor([1.0, 3.0])
            code = (xg / ds[:, None, :, None, None]).to(torch.float8_e4m3fn).view(x.shape)
            real = (code.float().view(xg.shape) * ds[:, None, :, None, None]).view(x.shape).double()
            return code, ds.float(), real
        qc, qds, qr = head_quant(torch.randn(b, sq, hq, d), hkv)
        kc, kds, kr = head_quant(torch.randn(b, sk, hkv, d), hkv)
        vc, vds, vr = head_quant(torch.randn(b, sk, hkv, d), hkv)
        for causal in (False, True):
            o, lse = fattn.flash_attn_func(qc, kc, vc, causal=causal, q_descale=qds, k_descale=kds,
                                           v_descale=vds, return_attn_probs=True)
            self.assertEqual(o.dtype, torch.bfloat16)
            s = torch.einsum("bqhd,bkhd->bhqk", qr, kr.repeat_interleave(g, dim=2)) / math.sqrt(d)
            if causal:
                s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), -math.inf)
            ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vr.repeat_interleave(g, dim=2))
            self.assertLess(float((o.double() - ref).norm() / ref.norm()), 2e-2)
            self.assertLess(float((lse.double() - torch.logsumexp(s, -1)).abs().max()), 1e-3)
        # FA3's default descale is 1; what e4m3 inputs cannot take is refused, never ignored
        o1 = fattn.flash_attn_func(qc, kc, vc)
        o2 = fattn.flash_attn_func(qc, kc, vc, q_descale=torch.ones(b, hkv), k_descale=torch.ones(b, hkv))
        self.assertTrue(torch.equal(o1, o2))
        # as FA3's FP8 call, inputs that require grad run the forward (FA3's own tests make them so);
        # a backward through it raises, never a gradient
        og = fattn.flash_attn_func(*(x.clone().requires_grad_() for x in (qc, kc, vc)))
        self.assertTrue(torch.equal(og.detach(), o1) and og.requires_grad)
        with self.assertRaises(NotImplementedError):
            og.float().sum().backward()
        with self.assertRaises(NotImplementedError):
            fattn.flash_attn_func(qc, kc, vc, softcap=10.0)
        with self.assertRaises(ValueError):
            fattn.flash_attn_func(qc, kc, vc, q_descale=torch.ones(b, hq))  # FA3's is per kv head

    def test_variants(self):
        # FA3's window_size and softcap, FA4's learnable_sink and (None, None) window: fattn.attention's
        q, k, v = inputs()
        sink = torch.tensor([0.5, -1.0, 2.0, 0.0])
        for fa, kw in ((dict(window_size=(8, 8)), dict(window_size=(8, 8))),
                       (dict(window_size=(8, 0)), dict(window_size=(8, 0))),
                       (dict(window_size=(-1, 8)), dict(window_size=(-1, 8))),
                       (dict(window_size=(None, 3)), dict(window_size=(-1, 3))),  # FA4's None: unbounded
                       (dict(window_size=(-5, 3)), dict(window_size=(-1, 3))),  # FA3: any negative is too
                       (dict(window_size=(None, None)), dict()),
                       (dict(window_size=(None, 0)), dict(causal=True)),  # FA's causal is (-inf, 0]
                       (dict(softcap=30.0), dict(softcap=30.0)), (dict(softcap=None), dict()),
                       (dict(learnable_sink=sink), dict(learnable_sink=sink)),
                       (dict(causal=True, window_size=(4, 4), softcap=2.0, learnable_sink=sink),
                        dict(causal=True, window_size=(4, 0), softcap=2.0, learnable_sink=sink))):
            o, lse = fattn.flash_attn_func(q, k, v, return_attn_probs=True, **fa)
            wo, wl = fattn.attention(q, k, v, return_lse=True, **kw)
            self.assertTrue(torch.equal(o, wo) and torch.equal(lse, wl), fa)
            # and positionally, in FA3's order (window_size 10th, softcap 12th), FA4's sink last
            args = (None, fa.get("causal", False), None, None, None, None, fa.get("window_size", (-1, -1)), 0,
                    fa.get("softcap", 0.0), 1, None, False, 0, False, fa.get("learnable_sink"))
            self.assertTrue(torch.equal(fattn.flash_attn_func(q, k, v, *args), wo), fa)

    def test_signature_is_fa3s(self):
        import inspect
        self.assertEqual(list(inspect.signature(fattn.flash_attn_func).parameters),
                         ["q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
                          "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic",
                          "sm_margin", "return_attn_probs", "learnable_sink"])  # FA3's, then FA4's sink


def sink_grads(fn, q, k, v, sink, dout):
    """(o, dq, dk, dv, dsink) of fn(q, k, v, sink) for dout."""
    q, k, v, sink = (t.detach().requires_grad_(True) for t in (q, k, v, sink))
    o = fn(q, k, v, sink)
    return (o,) + torch.autograd.grad(o, (q, k, v, sink), dout, allow_unused=True)


# The variants' cases: windows of 0, 1, smaller than the sequence and longer than it, one-sided; softcap
# with large logits (scale 1 on d 16: |s| up to ~15 against cap 2); sinks of -30, 0 and +30; combined.
SINK = torch.tensor([-30.0, 0.0, 1.5, 30.0])
VARIANTS = (dict(window_size=(3, 0)), dict(window_size=(0, 0)), dict(window_size=(1, 1)),
            dict(window_size=(-1, 2)), dict(window_size=(1000, 1000)), dict(softcap=5.0),
            dict(softcap=2.0, softmax_scale=1.0), dict(learnable_sink=SINK),
            dict(window_size=(4, -1), softcap=2.0, learnable_sink=SINK))


def variant_reference(q, k, v, causal, kw, return_lse=False):
    s = kw.get("learnable_sink")
    return reference(q, k, v, causal, kw.get("softmax_scale"), window=kw.get("window_size", (-1, -1)),
                     softcap=kw.get("softcap", 0.0), sink=s.to(q.dtype) if s is not None else None,
                     return_lse=return_lse)


class Variants(unittest.TestCase):
    """fattn.attention's window_size, softcap and learnable_sink on torch tensors (the
    custom ops fwd and bwd, autograd with d(learnable_sink)) against the float64 reference."""

    def test_matches_reference(self):
        for kw in VARIANTS:
            for causal in (False, True):
                for shape in (dict(), dict(sq=50, sk=20), dict(sq=1, sk=17)):
                    q, k, v = inputs(**shape)
                    o, lse = fattn.attention(q, k, v, causal=causal, return_lse=True, **kw)
                    ro, rl = variant_reference(q.double(), k.double(), v.double(), causal, kw, return_lse=True)
                    self.assertLess(rel(o, ro), 1e-5, (kw, causal, shape))
                    self.assertTrue(torch.equal(torch.isfinite(lse), torch.isfinite(rl)), (kw, causal, shape))
                    fin = torch.isfinite(rl)
                    self.assertLess((lse.double()[fin] - rl[fin]).abs().max().item(), 1e-4, (kw, causal, shape))

    def test_backward_f32_against_float64(self):
        # as Backward.test_f32_against_float64: within 2x torch's own f32 error (plus a floor),
        # both against float64; dsink (d learnable_sink, fattn_bwd's dsink) too
        for kw in VARIANTS:
            for causal, shape in ((False, dict()), (True, dict(sq=50, sk=20)), (False, dict(sq=1, sk=17, hkv=1))):
                q, k, v = inputs(**shape)
                dout = torch.randn(q.shape[:3] + (v.shape[3],), generator=torch.Generator().manual_seed(5))
                sink = kw.get("learnable_sink", torch.zeros(q.shape[2]))
                rest = {n: x for n, x in kw.items() if n != "learnable_sink"}
                with_sink = "learnable_sink" in kw

                def ref(a, b, c, s):
                    return variant_reference(a, b, c, causal, dict(rest, learnable_sink=s if with_sink else None))

                def ours(a, b, c, s):
                    return fattn.attention(a, b, c, causal=causal, learnable_sink=s if with_sink else None, **rest)

                want = sink_grads(ref, q.double(), k.double(), v.double(), sink.double(), dout.double())
                peer = sink_grads(ref, q, k, v, sink, dout)
                got = sink_grads(ours, q, k, v, sink, dout)
                for name, g, p, w in zip(("o", "dq", "dk", "dv", "dsink"), got, peer, want):
                    if name == "dsink" and not with_sink:
                        self.assertIsNone(g)  # the sink was not given: no gradient
                        continue
                    self.assertEqual(g.dtype, torch.float32)
                    # the floor: window (0, 0) leaves each row one key, so dq and dk are exactly 0
                    # and torch's f32 gets 0 too; fattn's D = rowsum(dout * o) then differs from
                    # dout . v by rounding (measured 4e-6 against 2e-7 |dout| = 1.4e-5)
                    err, peer_err = (g.double() - w).norm().item(), (p.double() - w).norm().item()
                    floor = 1e-6 * max(w.norm().item(), 1.0) + 2e-7 * dout.norm().item()
                    self.assertLessEqual(err, 2 * peer_err + floor, (name, kw, causal, shape))

    def test_backward_16bit(self):
        # bf16 / f16 inputs (the sink float32): within 2x the error of the same reference
        # computed in the inputs' dtype
        kw = dict(window_size=(5, 3), softcap=4.0)
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = inputs(dtype=dtype)
            dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(dtype)
            sink = torch.tensor([-1.0, 0.0, 0.5, 2.0])
            ref = lambda a, b, c, s: variant_reference(a, b, c, True, dict(kw, learnable_sink=s))  # noqa: E731
            want = sink_grads(ref, q.double(), k.double(), v.double(), sink.double(), dout.double())
            peer = sink_grads(ref, q, k, v, sink.to(dtype), dout)
            got = sink_grads(lambda a, b, c, s: fattn.attention(a, b, c, causal=True, learnable_sink=s, **kw),
                             q, k, v, sink, dout)
            for name, g, p, w in zip(("o", "dq", "dk", "dv", "dsink"), got, peer, want):
                self.assertEqual(g.dtype, torch.float32 if name == "dsink" else dtype)
                self.assertLessEqual(rel(g, w), 2 * rel(p, w) + 1e-3, (name, dtype))

    def test_gradcheck_f32(self):
        # finite differences of fattn's own forward (as Backward.test_gradcheck_f32), the sink an input
        q, k, v = inputs(b=1, sq=5, sk=6, hq=2, hkv=1, d=4, dv=3, grad=True)
        sink = torch.tensor([0.3, -0.7], requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "inputs are not double precision"
            for causal, kw in ((False, dict(window_size=(1, 2), softcap=1.5)), (True, dict(window_size=(2, -1)))):
                f = lambda a, b, c, s: fattn.attention(a, b, c, causal=causal, learnable_sink=s, **kw)  # noqa: E731
                self.assertTrue(torch.autograd.gradcheck(f, (q, k, v, sink), eps=1e-2, atol=5e-3, rtol=5e-3), kw)

    def test_sink_gradient_in_its_dtype(self):
        # a bf16 sink (FA4's dtype) gets a bf16 gradient, through the float32 the library reads
        q, k, v = inputs()
        sink = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.bfloat16, requires_grad=True)
        fattn.attention(q, k, v, learnable_sink=sink).sum().backward()
        self.assertEqual(sink.grad.dtype, torch.bfloat16)
        s32 = sink.detach().float().requires_grad_(True)
        fattn.attention(q, k, v, learnable_sink=s32).sum().backward()
        self.assertTrue(torch.equal(sink.grad, s32.grad.to(torch.bfloat16)))

    def test_no_keys(self):
        # sk = 0: o = 0, lse = the sink (fattn.h, FA4's rule), every gradient 0
        q, k, v = inputs(sk=0, grad=True)
        sink = SINK.clone().requires_grad_(True)
        o, lse = fattn.attention(q, k, v, learnable_sink=sink, return_lse=True)
        self.assertFalse(bool(o.any()))
        self.assertTrue(torch.equal(lse, SINK.view(1, -1, 1).expand(lse.shape)))
        o.sum().backward()
        for t in (q, k, v, sink):
            self.assertFalse(bool(t.grad.any()))

    def test_fp8_forward_only(self):
        kw = dict(window_size=(3, 0), softcap=5.0, learnable_sink=SINK)
        with self.assertRaises(NotImplementedError):
            fattn.attention(*inputs(grad=True), fp8=True, **kw)
        with self.assertRaises(NotImplementedError):  # the sink alone requiring grad
            fattn.attention(*inputs(), fp8=True, learnable_sink=SINK.clone().requires_grad_(True))
        q, k, v = inputs()
        o = fattn.attention(q, k, v, fp8=True, **kw)  # the CPU engine's fp8 forward takes every variant
        self.assertLess(rel(o, variant_reference(q.double(), k.double(), v.double(), False, kw)), 7e-2)

    def test_bad_values(self):
        q, k, v = inputs()
        for kw in (dict(window_size=(-2, 0)), dict(window_size=(1,)), dict(softcap=-1.0), dict(softcap=float("nan")),
                   dict(learnable_sink=torch.zeros(3))):
            with self.assertRaises(ValueError, msg=str(kw)):
                fattn.attention(q, k, v, **kw)
        with self.assertRaises(TypeError):
            fattn.attention(q, k, v, learnable_sink=[0.0] * 4)

    def test_opcheck(self):
        q, k, v = inputs(b=1, sq=7, sk=9, d=32, grad=True)
        sink = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
        for args in ((q, k, v, False, 0.3, False, False, 2, 1, 0.0, None),
                     (q, k, v, True, 0.3, False, False, -1, -1, 5.0, sink)):
            for name, res in torch.library.opcheck(torch.ops.fattn.fwd.default, args).items():
                self.assertEqual(res, "SUCCESS", name)
        o, lse = torch.ops.fattn.fwd(*args)
        bargs = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), True, 0.3,
                 False, -1, -1, 5.0, sink.detach())
        for name, res in torch.library.opcheck(torch.ops.fattn.bwd.default, bargs).items():
            self.assertEqual(res, "SUCCESS", name)
        self.assertEqual(tuple(torch.ops.fattn.bwd(*bargs)[3].shape), (4,))
        self.assertEqual(tuple(torch.ops.fattn.bwd(*bargs[:-1])[3].shape), (0,))  # no sink, no dsink

    def test_compile(self):
        # torch.compile(fullgraph=True) forward and backward, the sink an input: the same bits as eager
        q, k, v = inputs()
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
        sink = torch.tensor([0.5, -1.0, 2.0, 0.0])
        f = lambda q, k, v, s: fattn.attention(q * 1.5, k, v, window_size=(5, 2), softcap=3.0,  # noqa: E731
                                               learnable_sink=s)
        want = sink_grads(f, q, k, v, sink, dout)
        torch._dynamo.reset()
        cf = torch.compile(f, fullgraph=True, backend="aot_eager")
        got = sink_grads(cf, q, k, v, sink, dout)
        for name, a, w in zip(("o", "dq", "dk", "dv", "dsink"), got, want):
            self.assertTrue(torch.equal(a, w), name)


class BadArguments(unittest.TestCase):
    def test_dtypes(self):
        q, k, v = inputs()
        with self.assertRaises(TypeError) as cm:  # was a bare KeyError
            fattn.attention(q.double(), k.double(), v.double())
        self.assertIn("float64", str(cm.exception))
        with self.assertRaises(TypeError):  # k was read with q's element size, past its end
            fattn.attention(q, k.half(), v)
        with self.assertRaises(TypeError):
            fattn.attention(q.int(), k.int(), v.int())
        with self.assertRaises(TypeError):
            fattn.attention(q, k.tolist(), v)

    def test_shapes(self):
        q, k, v = inputs()
        for args in ((q[0], k, v), (q, k[:1], v), (q, k, v[:, :5]), (q, k[..., :8], v), (q[:, :, :3], k, v)):
            with self.assertRaises(ValueError):
                fattn.attention(*args)

    def test_devices(self):
        q, k, v = inputs()
        with self.assertRaises(ValueError):
            fattn.attention(q, k.to("meta"), v)
        with self.assertRaises(NotImplementedError):
            fattn.attention(*(x.to("meta") for x in (q, k, v)))

    def test_ctx_of_another_device(self):
        try:
            c = fattn.Context(fattn.BACKEND_CUDA, 0)
        except fattn.FattnError:
            self.skipTest("no CUDA context here")
        with self.assertRaises(ValueError):
            fattn.attention(*inputs(), ctx=c)

    def test_library_limit(self):
        with self.assertRaises(NotImplementedError) as cm:
            fattn.attention(*inputs(d=513, sq=2, sk=2))
        self.assertIn("head_dim 513", str(cm.exception))


@unittest.skipUnless(HOPPER, "needs a Hopper GPU")
class Cuda(unittest.TestCase):
    def test_forward_matches_cpu(self):
        for causal in (False, True):
            q, k, v = inputs(d=128, sq=300, sk=300, dtype=torch.bfloat16)
            o = fattn.attention(*(x.cuda() for x in (q, k, v)), causal=causal)
            self.assertEqual(o.device.type, "cuda")
            self.assertLess(rel(o.cpu(), reference(q.double(), k.double(), v.double(), causal)), 2e-2)

    def test_head_dims_96_192(self):
        # issue 37: head dims 96 and 192, and 192 with head_dim_v 128 (DeepSeek MLA prefill), GQA, causal with
        # unequal lengths, on the Hopper forward
        for d, dv, causal, (sq, sk) in ((96, 96, False, (300, 300)), (96, 96, True, (200, 333)),
                                        (192, 192, True, (300, 300)), (192, 192, False, (1, 77)),
                                        (192, 128, True, (333, 200)), (192, 128, False, (300, 300))):
            q, k, v = inputs(d=d, dv=dv, sq=sq, sk=sk, dtype=torch.bfloat16)
            o = fattn.attention(*(x.cuda() for x in (q, k, v)), causal=causal)
            self.assertEqual((o.device.type, o.dtype, o.shape[-1]), ("cuda", torch.bfloat16, dv))
            self.assertLess(rel(o.cpu(), reference(q.double(), k.double(), v.double(), causal)), 2e-2, (d, dv, causal))

    def test_head_dims_96_192_backward(self):
        # issue 37: the Hopper backward at head dims 96, 192 and 192/128 against float64 autograd (bf16 gradients,
        # the tolerance of test_backward_matches_reference)
        for d, dv, causal, (sq, sk) in ((96, 96, True, (200, 333)), (192, 192, False, (300, 300)),
                                        (192, 128, True, (300, 300)), (192, 128, False, (1, 77))):
            q, k, v = inputs(d=d, dv=dv, sq=sq, sk=sk, dtype=torch.bfloat16)
            g = torch.randn(q.shape[:3] + (dv,), generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
            xs = [x.cuda().requires_grad_(True) for x in (q, k, v)]
            fattn.attention(*xs, causal=causal).backward(g.cuda())
            ref = [x.double().requires_grad_(True) for x in (q, k, v)]
            reference(*ref, causal=causal).backward(g.double())
            for name, x, r in zip("qkv", xs, ref):
                self.assertEqual((x.grad.device.type, x.grad.dtype, x.grad.shape), ("cuda", torch.bfloat16, r.shape))
                self.assertLess(rel(x.grad.cpu(), r.grad), 1e-2, "d%d/%d causal %s d%s" % (d, dv, causal, name))

    def test_backward_matches_reference(self):
        # the Hopper backward (bf16 gradients: ~3e-3 relative, as cuDNN's) against float64 autograd
        for d, causal, (sq, sk) in ((64, False, (300, 300)), (128, True, (200, 333)), (128, False, (1, 77)),
                                    (256, True, (150, 100))):
            q, k, v = inputs(d=d, sq=sq, sk=sk, dtype=torch.bfloat16)
            g = torch.randn(q.shape[:3] + (d,), generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
            xs = [x.cuda().requires_grad_(True) for x in (q, k, v)]
            fattn.attention(*xs, causal=causal).backward(g.cuda())
            ref = [x.double().requires_grad_(True) for x in (q, k, v)]
            reference(*ref, causal=causal).backward(g.double())
            for name, x, r in zip("qkv", xs, ref):
                self.assertEqual((x.grad.device.type, x.grad.dtype), ("cuda", torch.bfloat16))
                self.assertLess(rel(x.grad.cpu(), r.grad), 1e-2, "d%d causal %s d%s" % (d, causal, name))


    def test_variants_match_reference(self):
        # the Hopper LOCAL kernels (window, softcap, sinks; bf16: ~4e-3 relative, as the plain forward)
        sink = torch.tensor([-2.0, 0.0, 1.5, 3.0])
        for d, causal, kw in ((64, False, dict(window_size=(37, 5))), (128, True, dict(learnable_sink=sink)),
                              (256, False, dict(window_size=(-1, 20), softcap=10.0, learnable_sink=sink))):
            q, k, v = inputs(d=d, sq=300, sk=333, dtype=torch.bfloat16)
            s = kw.get("learnable_sink")
            ckw = dict(kw, learnable_sink=s.cuda()) if s is not None else kw
            o, lse = fattn.attention(*(x.cuda() for x in (q, k, v)), causal=causal, return_lse=True, **ckw)
            ro, rl = reference(q.double(), k.double(), v.double(), causal, window=kw.get("window_size", (-1, -1)),
                               softcap=kw.get("softcap", 0.0), sink=s.double() if s is not None else None,
                               return_lse=True)
            self.assertEqual((o.device.type, o.dtype), ("cuda", torch.bfloat16))
            self.assertLess(rel(o.cpu(), ro), 2e-2, (d, causal, kw))
            self.assertLess((lse.cpu().double() - rl).abs().max().item(), 1e-2, (d, causal, kw))

    def test_variants_backward(self):
        # A sink that does not require grad: dq, dk, dv need only the sink-inclusive o and lse, which the
        # CUDA backward serves today (fattn.h).  Window, softcap and d(sink): the CUDA backward with the
        # variants is being written; until it lands the call raises NotImplementedError with the library's
        # message, and this test reports the cases it refused as a skip (they run once it serves them).
        sink = torch.tensor([-2.0, 0.0, 1.5, 3.0])
        refused = []
        for d, causal, kw, sink_grad in ((128, True, dict(learnable_sink=sink), False),
                                         (128, True, dict(learnable_sink=sink), True),
                                         (64, False, dict(window_size=(37, 5)), False),
                                         (128, True, dict(softcap=10.0), False),
                                         (256, False, dict(window_size=(-1, 20), softcap=10.0, learnable_sink=sink),
                                          True)):
            q, k, v = inputs(d=d, sq=200, sk=233, dtype=torch.bfloat16)
            g = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
            s = kw.get("learnable_sink")
            xs = [x.clone().cuda().requires_grad_(True) for x in (q, k, v)]
            cs = s.clone().cuda().requires_grad_(sink_grad) if s is not None else None
            try:
                o, lse = fattn.attention(*xs, causal=causal, return_lse=True, **dict(kw, learnable_sink=cs))
                o.backward(g.cuda())
            except NotImplementedError as e:
                self.assertIn("fattn backward on CUDA tensors", str(e))
                refused.append("%s%s: %s" % (kw, " (d sink)" if sink_grad else "", e))
                continue
            ref = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
            rs = s.detach().double().requires_grad_(True) if s is not None else None
            variant_reference(*ref, causal, dict(kw, learnable_sink=rs)).backward(g.double())
            for name, x, r in zip("qkv", xs, ref):
                self.assertLess(rel(x.grad.cpu(), r.grad), 1e-2, (d, causal, kw, name))
            if sink_grad:
                # d(sink)[h] = -sum over the head's rows of p_i D_i (p_i = exp(sink - lse_i), D_i = dO_i . O_i):
                # a sum whose terms cancel, so its error is measured against sum |p_i D_i|.  From this
                # forward's own O and LSE in float64 the backward's arithmetic alone (measured ~1e-7);
                # against the FP64 reference, bf16 O's rounding too (measured ~3e-4 at d256)
                p_i = torch.exp(rs.detach()[None, :, None] - lse.detach().cpu().double())  # [b, h, sq]
                terms = p_i * (g.double() * o.detach().cpu().double()).sum(-1).transpose(1, 2)
                size = terms.abs().sum((0, 2))
                own = (cs.grad.cpu().double() + terms.sum((0, 2))).abs() / size
                ref = (cs.grad.cpu().double() - rs.grad).abs() / size
                self.assertLess(own.max().item(), 1e-4, (d, causal, kw, "sink vs its own O and LSE"))
                self.assertLess(ref.max().item(), 2e-3, (d, causal, kw, "sink vs FP64"))
        self.assertNotIn("{'learnable_sink'", " ".join(r for r in refused if "(d sink)" not in r))
        if refused:
            self.skipTest("the CUDA backward refused: " + "; ".join(refused))

    def test_fp8_matches_cpu_and_refuses_block_sizes(self):
        q, k, v = inputs(d=128, sq=300, sk=300, dtype=torch.bfloat16)
        for cfg in (True, fattn.FP8(block_k=1, rotate=True), fattn.FP8(granularity="tensor", block_v=64)):
            o = fattn.attention(*(x.cuda() for x in (q, k, v)), causal=True, fp8=cfg)
            self.assertEqual((o.device.type, o.dtype), ("cuda", torch.bfloat16))
            self.assertLess(rel(o.cpu(), fattn.attention(q, k, v, causal=True)), 7e-2, cfg)
        for cfg in (fattn.FP8(block_k=64), fattn.FP8(block_v=100)):  # fattn.h: K 1 or 128n, V 128n
            with self.assertRaises(fattn.FattnUnsupportedError, msg=repr(cfg)):
                fattn.attention(*(x.cuda() for x in (q, k, v)), fp8=cfg)

    def test_context_per_device(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("one GPU")
        for dev in ("cuda:0", "cuda:1"):
            q, k, v = inputs(d=128, dtype=torch.bfloat16, device=dev)
            self.assertEqual(fattn.attention(q, k, v).device, torch.device(dev))


# ---------------------------------------------------------------------------
# CUDA: torch.compile and CUDA graphs (issue 25 item 3)
# ---------------------------------------------------------------------------

@unittest.skipUnless(HOPPER, "needs a Hopper GPU")
class CudaCompile(unittest.TestCase):
    """torch.compile(fullgraph=True) of Block on CUDA in bf16 (head dim 128, GQA 4/2, causal, 2 x 256 tokens):
    the output and the gradients of the input and of every parameter against the eager module's.

    Tolerance: relative Frobenius error < 1e-2 for each.  Eager and compiled call the same fattn kernels; what
    may differ is bf16 rounding: inductor fuses the bias adds and views around the GEMMs and rounds to bf16 at
    other points (unit roundoff 2^-9 ~ 2e-3 per rounded element), and fattn's dq is accumulated in fp32 in an
    order that varies from run to run (fattn.h, fattn_bwd: last-bit differences even between two eager runs).
    Those give ~1e-3 at most; a mistake in the graph (a lost gradient term, a wrong layout, scale or mask) is
    O(1e-1..1).  Measured (H200, torch 2.11, run of 2026-12-01): 0 for all with both backends (bitwise equal)
    but one parameter gradient under inductor, 5e-8."""

    def check(self, backend):
        torch.manual_seed(0)
        m = Block(dim=512, heads=4, kv_heads=2).to(device="cuda", dtype=torch.bfloat16)
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, generator=g)
        dy = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, generator=g)

        def run(f):
            m.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            y = f(xi)
            y.backward(dy)
            return [y.detach(), xi.grad] + [p.grad for p in m.parameters()]

        want = run(m)
        torch._dynamo.reset()
        got = run(torch.compile(m, fullgraph=True, backend=backend))  # fullgraph: a graph break is an error
        names = ["y", "dx"] + ["d_" + n for n, _ in m.named_parameters()]
        for n, a, w in zip(names, got, want):
            self.assertEqual((a.device.type, a.dtype), ("cuda", torch.bfloat16), n)
            self.assertLess(rel(a, w), 1e-2, "%s: %s" % (backend, n))

    def test_aot_eager(self):
        self.check("aot_eager")

    def test_inductor(self):
        try:
            import triton  # noqa: F401
        except ImportError as e:
            self.skipTest("inductor's CUDA code needs triton (%s)" % e)
        self.check("inductor")


def cuda_inputs(seed=0, **shape):
    return inputs(dtype=torch.bfloat16, device="cuda", seed=seed, **shape)


def refill(ts, seed, **shape):
    """New values, in place, into the static tensors ts (q, k, v[, dout] of `shape`)."""
    new = cuda_inputs(seed=seed, **shape)
    if len(ts) == 4:
        new.append(cuda_inputs(seed=seed + 100, **shape)[0])  # dout, shaped like q (head_dim == head_dim_v)
    with torch.no_grad():
        for t, n in zip(ts, new):
            t.copy_(n)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.view(torch.int16 if a.element_size() == 2 else torch.int32),
        b.view(torch.int16 if b.element_size() == 2 else torch.int32))


def capture(fn, warmups=2):
    """(graph, what fn returned inside the capture).  fn is first run on a side stream, as torch's CUDA graphs
    docs do: that also creates fattn's context and the workspaces the captured calls use (fattn.h allocates
    nothing while a stream is being captured: a split forward would run unsplit, a backward answer
    UNSUPPORTED).  The capture runs on torch.cuda.graph's own side stream: fattn must follow torch's current
    stream there (_torch._on_current_stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = fn()
    return g, res


# (shape, causal): non-causal calls that split their tiles along the keys (2 x 8 heads x 4 or 2 query tiles:
# fewer tiles than SMs, fattn.h FATTN_OPTION_DISABLE_SPLIT), causal ones (the per-context tile counter),
# bottom-right causal with seqlen_q < seqlen_k, GQA 8/2, head dims 64 and 128
GRAPH_FWD = [(dict(b=2, sq=sq, sk=sk, hq=8, hkv=2, d=d), causal)
             for d in (64, 128) for causal in (False, True) for sq, sk in ((512, 512), (200, 1000))]
# decoding: one query row, GQA 32/8, 4096 keys: the decoding kernel, which splits the keys over CTAs and
# merges the pieces through a workspace the context owns
GRAPH_DECODE = [(dict(b=2, sq=1, sk=4096, hq=32, hkv=8, d=d), causal) for d in (64, 128) for causal in (False, True)]
GRAPH_BWD = [(dict(b=2, sq=sq, sk=sk, hq=8, hkv=2, d=d), causal, det)
             for d in (64, 128) for causal, (sq, sk) in ((False, (300, 300)), (True, (200, 333)))
             for det in (True, False)]


def returns_before_gpu(fn, warmup=None):
    """fn() after a warm-up call (warmup, default fn) and a synchronize, queued behind a kernel that sleeps
    ~0.25-1.5 s, under torch's sync debug mode "error" (CudaGraph.test_no_host_synchronisation says why
    both): True when the sleep was still running as fn returned, i.e. fn did not wait for the GPU."""
    (warmup or fn)()
    torch.cuda.synchronize()
    before = torch.cuda.Event()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.cuda._sleep(500_000_000)  # cycles
        before.record()
        fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    pending = not before.query()
    torch.cuda.synchronize()
    return pending


@unittest.skipUnless(HOPPER, "needs a Hopper GPU")
class CudaGraph(unittest.TestCase):
    """fattn.attention captured by torch.cuda.graph on static tensors, replayed after new values are copied into
    them, against an eager call on the same values.

    Forward: bitwise.  fattn.h (fattn_ctx_set_stream): a forward call repeated on the same GPU gives the same
    bits, and the one way a captured call can differ, running unsplit because its split workspace does not
    exist yet, is ruled out by the warm-up (capture()).  The decoding kernel likewise (its workspace).
    Backward: o, dk and dv bitwise (dk and dv stay in registers, one CTA per key block: a fixed order); dq
    bitwise with deterministic=True; without it dq is summed in fp32 in an order that varies from run to run
    (fattn.h, fattn_bwd), so the fp32 sums differ in their last bits and their bf16 roundings by one ulp at most
    (<= 2^-7 |b|), but near 0, where the sum cancels and its rounding error is one of the summands' size: allowed
    |a - b| <= 2^-6 |b| (two ulps: one, plus a margin) + 2^-16 max|dq|.  Measured (H200, runs of 2026-12-01):
    the bitwise claims hold; without deterministic 0-13 of 2e5-6e5 dq elements differ, by up to 0.9 of
    2^-7 |b| + 2^-16 max|dq| (one-ulp flips)."""

    def check_forward(self, shape, causal):
        msg = "%s causal %s" % (shape, causal)
        q, k, v = cuda_inputs(**shape)
        g, (o, lse) = capture(lambda: fattn.attention(q, k, v, causal=causal, return_lse=True))
        outs = []
        for seed in (1, 2):
            refill((q, k, v), seed, **shape)
            g.replay()
            want, want_lse = fattn.attention(q, k, v, causal=causal, return_lse=True)
            self.assertTrue(same_bits(o, want), msg)
            self.assertTrue(same_bits(lse, want_lse), msg)
            # and eager is right (the Cuda class tests it; here against garbage in both)
            self.assertLess(rel(want, reference(q.float(), k.float(), v.float(), causal)), 2e-2, msg)
            outs.append(o.clone())
        self.assertFalse(torch.equal(outs[0], outs[1]), "the replays did not read the new inputs: " + msg)

    def test_forward(self):
        for shape, causal in GRAPH_FWD:
            self.check_forward(shape, causal)

    def test_decode(self):
        for shape, causal in GRAPH_DECODE:
            self.check_forward(shape, causal)

    def test_backward(self):
        # forward + loss.backward() captured with static gradients (torch's "whole network capture": the grads
        # are None before the capture, so that the backward allocates them from the graph's pool)
        for shape, causal, det in GRAPH_BWD:
            msg = "%s causal %s deterministic %s" % (shape, causal, det)
            q, k, v = (t.requires_grad_(True) for t in cuda_inputs(**shape))
            dout = torch.empty_like(q, requires_grad=False)
            refill((q, k, v, dout), 0, **shape)

            def step():
                for t in (q, k, v):
                    t.grad = None
                o = fattn.flash_attn_func(q, k, v, causal=causal, deterministic=det)
                o.backward(dout)
                return o.detach(), q.grad, k.grad, v.grad

            g, static = capture(step)
            dqs = []
            for seed in (1, 2):
                refill((q, k, v, dout), seed, **shape)
                g.replay()
                xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
                o = fattn.flash_attn_func(*xs, causal=causal, deterministic=det)
                o.backward(dout)
                want = [o.detach()] + [x.grad for x in xs]
                for name, a, w in zip(("o", "dq", "dk", "dv"), static, want):
                    if name != "dq" or det:
                        self.assertTrue(same_bits(a, w), "%s: %s" % (name, msg))
                    else:
                        torch.testing.assert_close(a, w, rtol=2 ** -6, atol=2 ** -16 * w.abs().max().item(),
                                                   msg=lambda m: "dq: %s: %s" % (msg, m))
                dqs.append(static[1].clone())
            self.assertFalse(torch.equal(dqs[0], dqs[1]), "the replays did not read the new inputs: " + msg)
            del g, static

    def test_capture_before_the_workspaces_exist(self):
        # A context that has made no call yet, so no split or decoding workspace: fattn.h says the captured call
        # then runs unsplit (nothing is allocated during a capture), with the same values up to rounding.  Its
        # out= is static, the call bypasses autograd (out=, ctx=).  Against the split eager call of the shared
        # context: P is rounded to bf16 for the PV product against each split's own running maximum, so the
        # rounding differs at the scale of the output, not of each element: |a - b| <= 2^-7 |b| + 2^-6 max|b|
        # (two bf16 ulps of the largest |o|), and a relative Frobenius error < 1e-2.  Measured (run of
        # 2026-12-01): the split forward bitwise equal; the decoding shape 3511 of 8192 elements apart, by at
        # most 4.9e-4 = one ulp of its largest |o| (0.108; 0.22 of the tolerance), relative error 2.6e-3.
        ctx = fattn.Context(fattn.BACKEND_CUDA, torch.cuda.current_device())
        try:
            for shape, causal in (GRAPH_FWD[0], GRAPH_DECODE[-1]):
                q, k, v = cuda_inputs(**shape)
                out = torch.empty_like(q)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fattn.attention(q, k, v, causal=causal, out=out, ctx=ctx)
                for seed in (1, 2):
                    refill((q, k, v), seed, **shape)
                    g.replay()
                    want = fattn.attention(q, k, v, causal=causal)
                    torch.testing.assert_close(out, want, rtol=2 ** -7, atol=2 ** -6 * want.abs().max().item(),
                                               msg=lambda m: "%s: %s" % (shape, m))
                    self.assertLess(rel(out, want), 1e-2, shape)
                del g
        finally:
            torch.cuda.synchronize()
            ctx.close()

    def test_first_call_inside_a_capture_raises(self):
        # No context for the device yet: creating one allocates, which would break the capture; the package
        # refuses with a message saying to warm up first (_torch._context), and the capture itself stays valid.
        from fattn import _core
        key = (_core.BACKEND_CUDA, torch.cuda.current_device())
        saved = _core._contexts.pop(key, None)
        try:
            q, k, v = cuda_inputs(d=64)
            g = torch.cuda.CUDAGraph()
            with self.assertRaises(RuntimeError) as cm:
                with torch.cuda.graph(g):
                    q2 = q * 2  # the graph is not empty
                    fattn.attention(q2, k, v)
            self.assertIn("CUDA graph", str(cm.exception))
            self.assertIn("before the capture", str(cm.exception))
            self.assertNotIn(key, _core._contexts)
            g.replay()  # the capture ended cleanly
            torch.cuda.synchronize()
        finally:
            if saved is not None:
                _core._contexts[key] = saved

    def test_no_host_synchronisation(self):
        # Two checks on eager calls (after a warm-up: the first call on a device creates the context, which waits
        # once for a memset of its own).  torch.cuda.set_sync_debug_mode("error") makes the synchronising torch
        # calls in the package raise (.item(), .cpu(), .tolist(), a pageable copy, nonzero, ...), but it sees
        # only torch's own, not what libfattn does through ctypes.  For those, a kernel that sleeps ~0.25-1.5 s
        # (by the clock) is queued before the call: had the call (or anything in it: cudaStreamSynchronize,
        # cudaDeviceSynchronize, a synchronous cudaMemcpy, cudaFree, ...) waited for the GPU, the sleep would be
        # over when it returns; it must still be running.  (The captures above show the same for the captured
        # path: a synchronisation or an allocation during a capture is an error that invalidates it.)
        for shape, causal, backward in ((GRAPH_FWD[0][0], False, False), (GRAPH_FWD[3][0], True, False),
                                        (GRAPH_DECODE[-1][0], True, False), (GRAPH_BWD[2][0], True, True)):
            q, k, v = (t.requires_grad_(backward) for t in cuda_inputs(**shape))
            dout = torch.randn_like(q)

            def call():
                o = fattn.attention(q, k, v, causal=causal)
                if backward:
                    o.backward(dout)
                return o

            self.assertTrue(returns_before_gpu(call), "the call waited for the GPU: %s causal %s backward %s"
                            % (shape, causal, backward))



# ---------------------------------------------------------------------------
# fattn.flash_attn_with_kvcache: decoding on a KV cache (issue 26)
# ---------------------------------------------------------------------------

def attention64(q, k, v, causal=False, scale=None):
    """(out, lse) of softmax attention in float64, FlashAttention's bottom-right causal mask; rows that see
    no key (or no key at all) give 0 and lse -inf."""
    q, k, v = q.double(), k.double(), v.double()
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = q.transpose(1, 2), k.repeat_interleave(hq // hkv, 2).transpose(1, 2), \
        v.repeat_interleave(hq // hkv, 2).transpose(1, 2)  # [b, h, s, d]
    s = (q @ k.transpose(-1, -2)) * scale  # matmul: torch's float64 einsum is ~100x slower on these shapes
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    lse = s.logsumexp(-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ v).transpose(1, 2), lse


def kvcache_reference(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, page_table=None, causal=False,
                      scale=None, cache_batch_idx=None, cache_leftpad=None):
    """FlashAttention's flash_attn_with_kvcache in plain torch: (out, lse, k_cache', v_cache').  k, v are
    written into copies of the caches at rows cache_seqlens[i] .. + s_new - 1 of each sequence (row j of
    sequence i: (i, j), or with page_table row j % page_size of page page_table[i, j // page_size]), then each
    sequence's first cache_seqlens[i] + s_new rows are gathered and attended in float64 (attention64)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    b = q.shape[0]
    if page_table is None:
        cap = kc.shape[1]
    else:
        ps = kc.shape[1]
        cap = page_table.shape[1] * ps
    if cache_seqlens is None:
        lens = [cap] * b
    elif isinstance(cache_seqlens, int):
        lens = [cache_seqlens] * b
    else:
        lens = [int(x) for x in cache_seqlens.tolist()]
    s_new = 0 if k is None else k.shape[1]

    ent = [int(x) for x in cache_batch_idx.tolist()] if cache_batch_idx is not None else list(range(b))
    pad = [int(x) for x in cache_leftpad.tolist()] if cache_leftpad is not None else [0] * b

    def where(i, j):  # FA3: cache_batch_idx picks the cache row (a contiguous cache's entry, a page table's row)
        if page_table is None:
            return torch.full_like(j, ent[i]), j
        return page_table[ent[i]].long()[j // ps], j % ps

    outs, lses = [], []
    for i in range(b):
        if k is not None:
            pi, ri = where(i, torch.arange(lens[i], lens[i] + s_new))
            kc[pi, ri] = k[i]
            vc[pi, ri] = v[i]
        pi, ri = where(i, torch.arange(pad[i], lens[i] + s_new))  # the keys from the left pad on
        o, lse = attention64(q[i:i + 1], kc[pi, ri][None], vc[pi, ri][None], causal, scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses).float(), kc, vc


def kv_setup(paged, b=3, cap=64, hkv=2, d=32, page=16, spare=2, dtype=torch.float32, device="cpu", seed=0):
    """(k_cache, v_cache, page_table or None): random caches of `cap` rows per sequence, contiguous
    [b, cap, hkv, d] or page pools [b * cap / page + spare, page, hkv, d] with each sequence's pages drawn
    from a shuffled order (spare pages belong to no sequence)."""
    g = torch.Generator().manual_seed(seed + 1000)
    if not paged:
        shape, table = (b, cap, hkv, d), None
    else:
        npp = cap // page
        shape = (b * npp + spare, page, hkv, d)
        table = torch.randperm(b * npp + spare, generator=g)[:b * npp].view(b, npp).to(torch.int32)
    kc, vc = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    if table is not None:
        table = table.to(device)
    return kc.to(device), vc.to(device), table


def kv_new(b=3, sq=1, s_new=1, hq=8, hkv=2, d=32, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype)
            for s in ((b, sq, hq, d), (b, s_new, hkv, d), (b, s_new, hkv, d))]


FA3_KVCACHE_ARGS = ["q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens",
                    "cache_batch_idx", "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new",
                    "max_seqlen_q", "rotary_seqlens", "q_descale", "k_descale", "v_descale", "softmax_scale",
                    "causal", "window_size", "attention_chunk", "softcap", "rotary_interleaved",
                    "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "return_softmax_lse",
                    "learnable_sink", "k_scale", "v_scale"]  # FA3's, then FA4's sink, then an FP8 cache's scales


class KvCache(unittest.TestCase):
    """fattn.flash_attn_with_kvcache on CPU tensors (the CPU engine) against kvcache_reference: the output
    and lse within f32 rounding of float64 (1e-5), the caches after the call equal, bit for bit, to the
    reference's copies (the new rows where they belong, every other row and page untouched)."""

    def check(self, msg, q, kc, vc, k, v, lens, table, causal, scale=None, tol=1e-5, **kw):
        want_o, want_lse, want_kc, want_vc = kvcache_reference(q, kc, vc, k, v, lens, table, causal, scale)
        ptrs = (kc.data_ptr(), vc.data_ptr())
        o, lse = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table, causal=causal,
                                               softmax_scale=scale, return_softmax_lse=True, **kw)
        self.assertEqual((o.dtype, tuple(o.shape)), (q.dtype, tuple(q.shape[:3]) + (vc.shape[3],)), msg)
        self.assertEqual((lse.dtype, tuple(lse.shape)), (torch.float32, (q.shape[0], q.shape[2], q.shape[1])), msg)
        self.assertEqual((kc.data_ptr(), vc.data_ptr()), ptrs, msg)  # in place
        self.assertTrue(same_bits(kc, want_kc) and same_bits(vc, want_vc), "caches: " + msg)
        if tol < 1e-3:
            torch.testing.assert_close(o.double(), want_o, rtol=tol, atol=tol, msg=lambda m: "%s: %s" % (msg, m))
        else:
            self.assertLess(rel(o, want_o), tol, msg)
        fin = torch.isfinite(want_lse)
        self.assertTrue(torch.equal(torch.isfinite(lse), fin), msg)
        torch.testing.assert_close(lse[fin], want_lse[fin], rtol=1e-5, atol=1e-5)
        return o, lse

    def check_varlen_q(self, device, tol):
        # FA3's cu_seqlens_q on a cache (no append): sequences of 2, 0 and 21 new queries packed in one q, each
        # against its own cache length, on contiguous and paged caches, both masks, against kvcache_reference
        # one sequence at a time
        lq, lens = [2, 0, 21], [10, 3, 40]
        cu = torch.tensor([0, 2, 2, 23], dtype=torch.int32)
        for paged in (False, True):
            for causal in (False, True):
                msg = "varlen q paged %s causal %s %s" % (paged, causal, device)
                kc, vc, table = kv_setup(paged, cap=64, d=64, seed=7)
                q = torch.randn(sum(lq), 8, 64, generator=torch.Generator().manual_seed(5))
                if device == "cuda":
                    q, kc, vc = (x.to(device="cuda", dtype=torch.bfloat16) for x in (q, kc, vc))
                o, lse = fattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32,
                                                                                               device=device),
                                                       page_table=kv_cuda(table) if device == "cuda" else table,
                                                       cu_seqlens_q=cu.to(device), max_seqlen_q=21, causal=causal,
                                                       return_softmax_lse=True)
                self.assertEqual((tuple(o.shape), tuple(lse.shape)), ((23, 8, 64), (8, 23)), msg)
                for b in range(3):
                    if lq[b] == 0:
                        continue
                    r = slice(int(cu[b]), int(cu[b + 1]))
                    kcb, vcb = (kc, vc) if paged else (kc[b:b + 1], vc[b:b + 1])
                    tb = table[b:b + 1] if paged else None
                    want_o, want_lse = kvcache_reference(q[r].unsqueeze(0).cpu(), kcb.cpu(), vcb.cpu(), None, None,
                                                         torch.tensor([lens[b]], dtype=torch.int32), tb, causal)[:2]
                    self.assertLess(rel(o[r].unsqueeze(0).cpu(), want_o), tol, msg)
                    fin = torch.isfinite(want_lse[0])
                    torch.testing.assert_close(lse[:, r].cpu()[fin].double(), want_lse[0][fin].double(), rtol=1e-3,
                                               atol=1e-3)

    def test_varlen_queries(self):
        self.check_varlen_q("cpu", 1e-5)

    def test_varlen_new_rows_batch_idx_leftpad(self):
        # FA3's cu_seqlens_q with cache_batch_idx and cache_leftpad (fattn_fwd takes them), and with new rows:
        # k, v [b, s_new] or packed by cu_seqlens_k_new (fattn_kv_append takes neither beside varlen queries:
        # written by indexing), on contiguous and paged caches (idx: row idx[b] of the page table), both masks;
        # each sequence against kvcache_reference alone, the caches after the call bit for bit; then packed
        # new rows beside [b, sq] queries.  Sequences of 2, 0 and 5 queries; 1, 0 and 3 packed new rows.
        lq, lens = [2, 0, 5], [20, 7, 30]
        cu_q, cu_k = torch.tensor([0, 2, 2, 7], dtype=torch.int32), torch.tensor([0, 1, 1, 4], dtype=torch.int32)
        idx, pad = torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([2, 0, 10], dtype=torch.int32)
        g = torch.Generator().manual_seed(31)
        q = torch.randn(7, 8, 64, generator=g)
        k_b, v_b = torch.randn(3, 2, 2, 64, generator=g), torch.randn(3, 2, 2, 64, generator=g)
        k_p, v_p = torch.randn(4, 2, 64, generator=g), torch.randn(4, 2, 64, generator=g)
        n = 0
        for paged in (False, True):
            for use_idx, use_pad in ((False, False), (True, False), (False, True), (True, True)):
                for new in ("none", "batched", "packed"):
                    for causal in (False, True):
                        msg = "paged %s idx %s pad %s new %s causal %s" % (paged, use_idx, use_pad, new, causal)
                        kc, vc, table = kv_setup(paged, b=5 if use_idx else 3, cap=64, d=64, seed=n)
                        n += 1
                        kw = dict(cache_batch_idx=idx if use_idx else None, cache_leftpad=pad if use_pad else None)
                        k, v = dict(none=(None, None), batched=(k_b, v_b), packed=(k_p, v_p))[new]
                        want_kc, want_vc = kc.clone(), vc.clone()
                        o, lse = fattn.flash_attn_with_kvcache(
                            q, kc, vc, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32), page_table=table,
                            cu_seqlens_q=cu_q, max_seqlen_q=5, cu_seqlens_k_new=cu_k if new == "packed" else None,
                            causal=causal, return_softmax_lse=True, **kw)
                        self.assertEqual((tuple(o.shape), tuple(lse.shape)), ((7, 8, 64), (8, 7)), msg)
                        for b in range(3):
                            r = slice(int(cu_q[b]), int(cu_q[b + 1]))
                            kb = vb = None
                            if new == "batched":
                                kb, vb = k_b[b:b + 1], v_b[b:b + 1]
                            elif new == "packed":
                                kr = slice(int(cu_k[b]), int(cu_k[b + 1]))
                                kb, vb = k_p[kr].unsqueeze(0), v_p[kr].unsqueeze(0)
                            # sequence b alone: its cache entry (or page table row) picked by cache_batch_idx
                            ent = torch.tensor([int(idx[b]) if use_idx else b], dtype=torch.int32)
                            wo, wl, want_kc, want_vc = kvcache_reference(
                                q[r].unsqueeze(0), want_kc, want_vc, kb, vb, torch.tensor([lens[b]], dtype=torch.int32),
                                table, causal, cache_batch_idx=ent, cache_leftpad=pad[b:b + 1] if use_pad else None)
                            if lq[b]:
                                torch.testing.assert_close(o[r].unsqueeze(0).double(), wo, rtol=1e-5, atol=1e-5,
                                                           msg=lambda m: "%s seq %d: %s" % (msg, b, m))
                                fin = torch.isfinite(wl[0])
                                torch.testing.assert_close(lse[:, r][fin], wl[0][fin], rtol=1e-5, atol=1e-5)
                        self.assertTrue(same_bits(kc, want_kc) and same_bits(vc, want_vc), "caches: " + msg)
        # packed new rows beside [b, sq] queries: as the same rows given [b, s_new] where every sequence has
        # s_new of them, and the rows no sequence appends left as they were
        kc, vc, table = kv_setup(True, cap=64, d=64, seed=99)
        q4, _, _ = kv_new(sq=2, d=64, seed=99)
        lens_t = torch.tensor(lens, dtype=torch.int32)
        kc2, vc2 = kc.clone(), vc.clone()
        cu_2 = torch.tensor([0, 2, 4, 6], dtype=torch.int32)
        kp2, vp2 = torch.randn(6, 2, 64, generator=g), torch.randn(6, 2, 64, generator=g)
        got = fattn.flash_attn_with_kvcache(q4, kc, vc, kp2, vp2, cache_seqlens=lens_t, page_table=table,
                                            cu_seqlens_k_new=cu_2, causal=True, return_softmax_lse=True)
        want = fattn.flash_attn_with_kvcache(q4, kc2, vc2, kp2.view(3, 2, 2, 64), vp2.view(3, 2, 2, 64),
                                             cache_seqlens=lens_t, page_table=table, causal=True,
                                             return_softmax_lse=True)
        self.assertTrue(same_bits(got[0], want[0]) and same_bits(got[1], want[1]))
        self.assertTrue(same_bits(kc, kc2) and same_bits(vc, vc2))
        # refusals before anything is written: rows past the capacity, k not packed, an FP8 cache
        kc1, vc1, _ = kv_setup(False, cap=64, d=64, seed=5)
        before = (kc1.clone(), vc1.clone())
        for kk, kw in ((k_p, dict(cache_seqlens=torch.tensor([0, 0, 62], dtype=torch.int32), cu_seqlens_k_new=cu_k)),
                       (k_b, dict(cache_seqlens=lens_t, cu_seqlens_k_new=cu_k))):
            with self.assertRaises(ValueError):
                fattn.flash_attn_with_kvcache(q, kc1, vc1, kk, kk, cu_seqlens_q=cu_q, max_seqlen_q=5, **kw)
        self.assertTrue(same_bits(kc1, before[0]) and same_bits(vc1, before[1]))
        with self.assertRaises(ValueError):  # cu_seqlens_k_new without the rows
            fattn.flash_attn_with_kvcache(q, kc1, vc1, cache_seqlens=lens_t, cu_seqlens_q=cu_q, max_seqlen_q=5,
                                          cu_seqlens_k_new=cu_k)

    def test_rotary_arguments_without_rotary_cos(self):
        # FA3 ignores rotary_seqlens and rotary_interleaved without rotary_cos / rotary_sin (its own test passes
        # rotary_seqlens=cache_seqlens either way): the same bits as the call without them; with rotary_cos
        # or rotary_sin the call is refused, the caches untouched
        kc, vc, table = kv_setup(True, seed=37)
        q, k, v = kv_new(sq=2, s_new=2, seed=37)
        lens = torch.tensor([1, 20, 40], dtype=torch.int32)
        kc2, vc2 = kc.clone(), vc.clone()
        want = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table, causal=True,
                                             return_softmax_lse=True)
        got = fattn.flash_attn_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=lens, page_table=table, causal=True,
                                            rotary_seqlens=lens, rotary_interleaved=False, return_softmax_lse=True)
        self.assertTrue(same_bits(got[0], want[0]) and same_bits(got[1], want[1]))
        self.assertTrue(same_bits(kc2, kc) and same_bits(vc2, vc))
        cos = torch.ones(64, 16)
        for kw in (dict(rotary_cos=cos, rotary_sin=cos, rotary_seqlens=lens), dict(rotary_cos=cos),
                   dict(rotary_sin=cos)):
            with self.assertRaises(NotImplementedError) as cm:
                fattn.flash_attn_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=lens, page_table=table, **kw)
            self.assertIn("rotary_", str(cm.exception))
        self.assertTrue(same_bits(kc2, kc) and same_bits(vc2, vc))

    def test_e4m3_q_refused(self):
        # FA3's FP8 decoding (e4m3 q, k, v and caches): a NotImplementedError naming q's dtype, not a TypeError
        kc, vc, _ = kv_setup(False, seed=41)
        q, k, v = kv_new(seed=41)
        e4 = [t.to(torch.float8_e4m3fn) for t in (q, kc, vc, k, v)]
        with self.assertRaises(NotImplementedError) as cm:
            fattn.flash_attn_with_kvcache(e4[0], e4[1], e4[2], e4[3], e4[4], cache_seqlens=3)
        self.assertIn("float8_e4m3fn q", str(cm.exception))

    def check_batch_idx_and_leftpad(self, device, dtype, tol):
        # FA3's cache_batch_idx (sequence b reads entry idx[b] of a cache of 5; on a paged cache, row idx[b] of
        # the page table) and cache_leftpad (its keys from row pad[b] on), alone and together, with and without
        # an append, both masks, against kvcache_reference; the caches after the call bit for bit
        idx, pad, lens = torch.tensor([4, 0, 4], dtype=torch.int32), torch.tensor([2, 0, 10], dtype=torch.int32), \
            torch.tensor([20, 7, 30], dtype=torch.int32)
        for paged in (False, True):
            for use_idx, use_pad in ((True, False), (False, True), (True, True)):
                if paged and use_pad and device == "cuda":
                    continue  # the CUDA kernels take a left pad on contiguous caches only (fattn.h)
                for append in (False, True):
                    for causal in (False, True):
                        msg = "paged %s idx %s pad %s append %s causal %s %s" % (paged, use_idx, use_pad, append,
                                                                                   causal, device)
                        kc, vc, table = kv_setup(paged, b=5 if use_idx else 3, cap=64, d=64, dtype=dtype, seed=3)
                        q, k, v = kv_new(sq=3, s_new=2, d=64, dtype=dtype, seed=4)
                        if not append:
                            k = v = None
                        kw = dict(cache_batch_idx=idx if use_idx else None, cache_leftpad=pad if use_pad else None)
                        want_o, want_lse, want_kc, want_vc = kvcache_reference(q, kc, vc, k, v, lens, table, causal,
                                                                               **kw)
                        dev = lambda t: None if t is None else t.to(device)  # noqa: E731
                        kcd, vcd = kc.to(device), vc.to(device)
                        o, lse = fattn.flash_attn_with_kvcache(dev(q), kcd, vcd, dev(k), dev(v), cache_seqlens=dev(lens),
                                                               page_table=dev(table), causal=causal,
                                                               return_softmax_lse=True,
                                                               **{n: dev(t) for n, t in kw.items()})
                        self.assertTrue(same_bits(kcd.cpu(), want_kc) and same_bits(vcd.cpu(), want_vc), msg)
                        self.assertLess(rel(o.cpu(), want_o), tol, msg)
                        fin = torch.isfinite(want_lse)
                        self.assertTrue(torch.equal(torch.isfinite(lse.cpu()), fin), msg)
                        torch.testing.assert_close(lse.cpu()[fin].double(), want_lse[fin].double(), rtol=1e-3,
                                                   atol=1e-3)

    def test_batch_idx_and_leftpad(self):
        self.check_batch_idx_and_leftpad("cpu", torch.float32, 1e-5)

    def test_matches_reference(self):
        # contiguous and paged (page 16, shuffled) caches; without and with an append of sq rows; seqlen_q 1
        # and 3; both masks; cache_seqlens as a tensor (0, 17 and the last rows of the cache: rows with no key,
        # and causal rows that see part of the new keys) and as an int
        n = 0
        for paged in (False, True):
            for append in (False, True):
                for sq in (1, 3):
                    for causal in (False, True):
                        for as_int in (False, True):
                            kc, vc, table = kv_setup(paged, seed=n)
                            q, k, v = kv_new(sq=sq, s_new=sq, seed=n)
                            s_new = sq if append else 0
                            lens = 20 if as_int else torch.tensor([0, 17, 64 - s_new], dtype=torch.int32)
                            msg = "paged %s append %s sq %d causal %s int %s" % (paged, append, sq, causal, as_int)
                            self.check(msg, q, kc, vc, k if append else None, v if append else None, lens, table,
                                       causal)
                            n += 1

    def test_more_new_rows_than_queries_and_scale(self):
        for paged in (False, True):
            kc, vc, table = kv_setup(paged, seed=5)
            q, k, v = kv_new(sq=1, s_new=5, seed=5)
            lens = torch.tensor([3, 14, 40], dtype=torch.int32)  # new rows cross page boundaries
            self.check("paged %s" % paged, q, kc, vc, k, v, lens, table, True, scale=0.3)

    def test_16bit(self):
        # bf16 and f16 against float64: 16-bit inputs and output, f32 inside (2e-2 and 3e-3, as Forward's)
        for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 3e-3)):
            for paged in (False, True):
                kc, vc, table = kv_setup(paged, dtype=dtype, seed=7)
                q, k, v = kv_new(sq=3, s_new=3, dtype=dtype, seed=7)
                lens = torch.tensor([5, 30, 60], dtype=torch.int32)
                self.check("%s paged %s" % (dtype, paged), q, kc, vc, k, v, lens, table, True, tol=tol)

    def test_whole_cache_without_cache_seqlens(self):
        # cache_seqlens None: every key of the cache (paged: max_pages * page_size per sequence), as FA3
        for paged in (False, True):
            kc, vc, table = kv_setup(paged, seed=9)
            q, _, _ = kv_new(sq=3, seed=9)
            for causal in (False, True):
                o, _ = self.check("paged %s causal %s" % (paged, causal), q, kc, vc, None, None, None, table, causal)
                if not paged:
                    self.assertLess(rel(o, reference(q.double(), kc.double(), vc.double(), causal)), 1e-5)

    def test_append_writes_exactly_the_new_rows(self):
        # the changed elements of the caches are exactly the new rows, holding k's and v's bits, in place
        for paged in (False, True):
            kc, vc, table = kv_setup(paged, seed=11)
            before = (kc.clone(), vc.clone())
            q, k, v = kv_new(sq=2, s_new=2, seed=11)
            lens = torch.tensor([0, 15, 62], dtype=torch.int32)  # 15: rows 15 and 16 lie in two pages
            out = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table)
            self.assertIsInstance(out, torch.Tensor)  # return_softmax_lse False: out alone
            for cache, old, new in ((kc, before[0], k), (vc, before[1], v)):
                changed = (cache.view(torch.int32) != old.view(torch.int32)).any(-1).any(-1)  # [rows of pages]
                expect = torch.zeros_like(changed)
                for i, n0 in enumerate(lens.tolist()):
                    for t in range(2):
                        j = n0 + t
                        pi, ri = (i, j) if table is None else (int(table[i, j // 16]), j % 16)
                        expect[pi, ri] = True
                        self.assertTrue(torch.equal(cache[pi, ri].view(torch.int32), new[i, t].view(torch.int32)))
                self.assertTrue(torch.equal(changed, expect), "paged %s" % paged)

    def test_unused_rows_never_reach_the_output(self):
        # rows past cache_seqlens (+ s_new) hold NaN: the output is that of the used rows alone
        for paged in (False, True):
            kc, vc, table = kv_setup(paged, seed=13)
            q, k, v = kv_new(sq=1, s_new=1, seed=13)
            lens = torch.tensor([4, 20, 33], dtype=torch.int32)
            want = kvcache_reference(q, kc, vc, k, v, lens, table, True)[0]
            if table is None:
                for i, n in enumerate(lens.tolist()):
                    kc[i, n + 1:] = float("nan")
                    vc[i, n + 1:] = float("nan")
            else:
                used = set()
                for i, n in enumerate(lens.tolist()):
                    used |= {int(table[i, j // 16]) * 16 + j % 16 for j in range(n + 1)}
                flat_k, flat_v = kc.view(-1, 2, 32), vc.view(-1, 2, 32)
                for r in range(flat_k.shape[0]):
                    if r not in used:
                        flat_k[r] = float("nan")
                        flat_v[r] = float("nan")
            o = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table, causal=True)
            self.assertTrue(bool(torch.isfinite(o).all()), "paged %s" % paged)
            torch.testing.assert_close(o.double(), want, rtol=1e-5, atol=1e-5)

    def test_decode_loop(self):
        # docs/python.md's loop: prefill, then one token per step appended and attended; each step's output
        # is causal attention of the step's query over every key so far (fattn.attention on the whole sequence)
        b, hq, hkv, d, cap = 2, 8, 2, 32, 48
        for paged in (False, True):
            g = torch.Generator().manual_seed(3)
            seq_k, seq_v = torch.randn(b, 40, hkv, d, generator=g), torch.randn(b, 40, hkv, d, generator=g)
            qs = torch.randn(b, 40, hq, d, generator=g)
            if paged:
                table = torch.randperm(b * cap // 16, generator=g).view(b, cap // 16).to(torch.int32)
                kc, vc = torch.zeros(b * cap // 16, 16, hkv, d), torch.zeros(b * cap // 16, 16, hkv, d)
            else:
                table = None
                kc, vc = torch.zeros(b, cap, hkv, d), torch.zeros(b, cap, hkv, d)
            lens = torch.zeros(b, dtype=torch.int32)
            want = fattn.attention(qs[:, :32], seq_k[:, :32], seq_v[:, :32], causal=True)
            if not paged:  # prefill as docs/python.md does: fattn.attention, the prompt copied into the cache
                o = want
                kc[:, :32], vc[:, :32] = seq_k[:, :32], seq_v[:, :32]
            else:  # prefill: the first 32 tokens in one call (the CPU engine serves any seqlen_q)
                o = fattn.flash_attn_with_kvcache(qs[:, :32], kc, vc, seq_k[:, :32], seq_v[:, :32],
                                                  cache_seqlens=lens, page_table=table, causal=True)
            lens += 32
            self.assertLess(rel(o, want), 1e-6)
            for t in range(32, 40):
                o = fattn.flash_attn_with_kvcache(qs[:, t:t + 1], kc, vc, seq_k[:, t:t + 1], seq_v[:, t:t + 1],
                                                  cache_seqlens=lens, page_table=table, causal=True)
                lens += 1
                want = fattn.attention(qs[:, t:t + 1], seq_k[:, :t + 1], seq_v[:, :t + 1], causal=True)
                self.assertLess(rel(o, want), 1e-6, "paged %s step %d" % (paged, t))
            self.assertEqual(lens.tolist(), [40, 40])

    def test_hints_change_nothing(self):
        kc, vc, table = kv_setup(True, seed=17)
        q, k, v = kv_new(sq=3, s_new=3, seed=17)
        lens = torch.tensor([1, 20, 40], dtype=torch.int32)
        want = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table, causal=True,
                                             return_softmax_lse=True)
        for hint in (dict(num_splits=0), dict(num_splits=1), dict(num_splits=3), dict(num_splits=None),
                     dict(pack_gqa=True),
                     dict(pack_gqa=False), dict(max_seqlen_q=3), dict(rotary_interleaved=False),
                     dict(window_size=[-1, -1]), dict(sm_margin=0), dict(causal=False, window_size=(-1, 0))):
            kw = dict(causal=True)
            kw.update(hint)
            got = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table,
                                                return_softmax_lse=True, **kw)
            self.assertTrue(same_bits(got[0], want[0]) and same_bits(got[1], want[1]), hint)
        # cache_seqlens and page_table of another integer dtype: converted (on the device), the same call
        got = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens.long(), page_table=table.long(),
                                            causal=True)
        self.assertTrue(same_bits(got, want[0]))

    def test_num_splits_1_restores_the_option(self):
        from fattn import _core
        ctx = _core.context(_core.BACKEND_CPU)
        kc, vc, _ = kv_setup(False)
        q, _, _ = kv_new()
        fattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, num_splits=1)
        self.assertEqual(ctx._options.get(fattn.OPTION_DISABLE_SPLIT, 0), 0)

    def test_unsupported_arguments_raise(self):
        kc, vc, table = kv_setup(True, seed=19)
        q, k, v = kv_new(sq=1, s_new=1, seed=19)
        lens = torch.tensor([1, 2, 3], dtype=torch.int32)
        before = (kc.clone(), vc.clone())
        t = torch.ones(3, dtype=torch.int32)
        for bad in (dict(qv=q), dict(rotary_cos=torch.ones(64, 16)), dict(rotary_sin=torch.ones(64, 16)),
                    dict(q_descale=torch.ones(3, 2)),
                    dict(k_descale=torch.ones(3, 2)), dict(v_descale=torch.ones(3, 2)),
                    dict(scheduler_metadata=t), dict(sm_margin=8)):
            with self.assertRaises(NotImplementedError, msg=str(bad)) as cm:
                fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table, **bad)
            self.assertIn("not supported by fattn", str(cm.exception))
            self.assertTrue(torch.equal(kc, before[0]) and torch.equal(vc, before[1]), bad)  # nothing written
        # an append of V rows longer than K's (head_dim_v != head_dim): fattn_kv_append copies one row length
        kc2, vc2 = torch.zeros(3, 64, 2, 32), torch.zeros(3, 64, 2, 16)
        with self.assertRaises(NotImplementedError) as cm:
            fattn.flash_attn_with_kvcache(q, kc2, vc2, k, v[..., :16], cache_seqlens=lens)
        self.assertIn("head_dim_v", str(cm.exception))
        self.assertFalse(bool(kc2.any()))
        # without an append head_dim_v != head_dim is served (CPU engine)
        o = fattn.flash_attn_with_kvcache(q, kc2.normal_(), vc2.normal_(), cache_seqlens=lens)
        self.assertLess(rel(o, kvcache_reference(q, kc2, vc2, cache_seqlens=lens)[0]), 1e-5)

    def test_variants(self):
        # window_size, softcap and learnable_sink on the cache's used keys (bottom-right aligned on them),
        # after an append, against the float64 reference on each sequence's keys; paged = contiguous
        kc, vc, _ = kv_setup(False, seed=23)
        q, k, v = kv_new(sq=3, s_new=2, hq=4, seed=23)
        lens = torch.tensor([5, 0, 40], dtype=torch.int32)
        sink = torch.tensor([-30.0, 0.0, 1.5, 30.0])
        for causal, kw in ((True, dict(window_size=(3, 0))), (False, dict(window_size=(1, 1), softcap=2.0)),
                           (True, dict(learnable_sink=sink)), (True, dict(window_size=(6, -1), softcap=3.0,
                                                                         learnable_sink=sink))):
            kc1, vc1 = kc.clone(), vc.clone()
            o, lse = fattn.flash_attn_with_kvcache(q, kc1, vc1, k, v, cache_seqlens=lens, causal=causal,
                                                   return_softmax_lse=True, **kw)
            for i, n in enumerate((lens + 2).tolist()):
                wo, wl = variant_reference(q[i:i + 1].double(), kc1[i:i + 1, :n].double(), vc1[i:i + 1, :n].double(),
                                           causal, dict(kw, learnable_sink=sink.double()
                                                        if "learnable_sink" in kw else None), return_lse=True)
                self.assertLess(rel(o[i:i + 1], wo), 1e-5, (causal, kw, i))
                fin = torch.isfinite(wl)
                self.assertTrue(torch.equal(torch.isfinite(lse[i:i + 1]), fin), (causal, kw, i))
                self.assertLess((lse[i:i + 1].double()[fin] - wl[fin]).abs().max().item(), 1e-4, (causal, kw, i))
            # the same through a paged cache holding the same rows
            page = 16
            table = torch.arange(3 * 64 // page, dtype=torch.int32).flip(0).view(3, -1).contiguous()
            kp, vp = (torch.empty(3 * 64 // page, page, 2, 32) for _ in range(2))
            for i in range(3):
                for j in range(64 // page):
                    kp[table[i, j]] = kc[i, j * page:(j + 1) * page]
                    vp[table[i, j]] = vc[i, j * page:(j + 1) * page]
            po = fattn.flash_attn_with_kvcache(q, kp, vp, k, v, cache_seqlens=lens, page_table=table, causal=causal,
                                               **kw)
            torch.testing.assert_close(po, o, rtol=1e-6, atol=1e-6)
        with self.assertRaises(NotImplementedError):  # forward only, the sink too
            fattn.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), cache_seqlens=lens,
                                          learnable_sink=sink.clone().requires_grad_(True))

    def test_autograd_refused(self):
        kc, vc, _ = kv_setup(False)
        q, k, v = kv_new()
        for name in ("q", "k", "v", "k_cache"):
            ts = dict(q=q.clone(), k=k.clone(), v=v.clone(), k_cache=kc.clone())
            ts[name].requires_grad_(True)
            with self.assertRaises(NotImplementedError) as cm:
                fattn.flash_attn_with_kvcache(ts["q"], ts["k_cache"], vc, ts["k"], ts["v"], cache_seqlens=3)
            self.assertIn("forward only", str(cm.exception))
            self.assertIn(name, str(cm.exception))
        qg = q.clone().requires_grad_(True)
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                o = fattn.flash_attn_with_kvcache(qg, kc, vc, k, v, cache_seqlens=3)
            self.assertFalse(o.requires_grad)

    def test_bad_arguments(self):
        kc, vc, table = kv_setup(True)
        q, k, v = kv_new(sq=1, s_new=2)
        lens = torch.tensor([1, 2, 3], dtype=torch.int32)
        before = (kc.clone(), vc.clone())
        for args, kw in (((q, kc, vc, k), dict(cache_seqlens=lens, page_table=table)),  # k without v
                         ((q, kc, vc, k, v), dict(page_table=table)),  # an append without cache_seqlens
                         ((q, kc, vc), dict(cache_seqlens=lens[:2], page_table=table)),
                         ((q, kc, vc), dict(cache_seqlens=lens, page_table=table[:2])),
                         ((q, kc, vc), dict(cache_seqlens=lens, page_table=table[0])),
                         ((q, kc, vc), dict(cache_seqlens=-1, page_table=table)),
                         ((q, kc, vc[:, :8]), dict(cache_seqlens=lens, page_table=table)),  # page sizes differ
                         ((q, kc, vc, k[:, :, :1], v), dict(cache_seqlens=lens, page_table=table)),
                         ((q, kc, vc, k, v[:, :1]), dict(cache_seqlens=lens, page_table=table)),
                         ((q[..., :16], kc, vc), dict(cache_seqlens=lens, page_table=table)),
                         ((q[:, :, :3], kc, vc), dict(cache_seqlens=lens, page_table=table)),
                         ((q[:2], kc[:, 0], vc[:, 0]), dict(cache_seqlens=lens[:2])),  # a contiguous cache of 3
                         ((q, kc, vc), dict(cache_seqlens=lens.to("meta"), page_table=table)),
                         ((q, kc.transpose(2, 3), vc.transpose(2, 3)), dict(cache_seqlens=lens, page_table=table))):
            with self.assertRaises(ValueError, msg=str([tuple(a.shape) for a in args] + [kw.keys()])):
                fattn.flash_attn_with_kvcache(*args, **kw)
        for args, kw in (((q, kc, vc), dict(cache_seqlens=lens.float(), page_table=table)),
                         ((q, kc, vc), dict(cache_seqlens=[1, 2, 3], page_table=table)),
                         ((q, kc, vc), dict(cache_seqlens=lens, page_table=table.float())),
                         ((q, kc.half(), vc.half()), dict(cache_seqlens=lens, page_table=table)),
                         ((q, kc, vc, k.half(), v.half()), dict(cache_seqlens=lens, page_table=table)),
                         ((q.double(), kc.double(), vc.double()), dict(cache_seqlens=lens, page_table=table))):
            with self.assertRaises(TypeError, msg=str(kw.keys())):
                fattn.flash_attn_with_kvcache(*args, **kw)
        with self.assertRaises(TypeError):
            fattn.flash_attn_with_kvcache(q.numpy(), kc, vc, cache_seqlens=lens, page_table=table)
        self.assertTrue(torch.equal(kc, before[0]) and torch.equal(vc, before[1]))
        # the library's refusals, before anything is written: rows past a sequence's pages, a page outside
        # the pool (CPU engine: checked on the host)
        for lens2, table2 in ((torch.tensor([1, 2, 63], dtype=torch.int32), table),
                              (lens, torch.where(table == table[2, 0], 99, table))):
            with self.assertRaises(fattn.FattnInvalidArgumentError) as cm:
                fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens2, page_table=table2)
            self.assertIn("fattn_kv_append", str(cm.exception))
            self.assertTrue(torch.equal(kc, before[0]) and torch.equal(vc, before[1]))
        kc1, vc1, _ = kv_setup(False)
        with self.assertRaises(fattn.FattnInvalidArgumentError):  # 63 + 2 rows > capacity 64
            fattn.flash_attn_with_kvcache(q, kc1, vc1, k, v, cache_seqlens=63)
        # K and V interleaved in one buffer: the library refuses outputs that overlap (fattn.h)
        kv = torch.zeros(3, 64, 2, 2, 32)
        with self.assertRaises(fattn.FattnInvalidArgumentError):
            fattn.flash_attn_with_kvcache(q, kv[:, :, 0], kv[:, :, 1], k, v, cache_seqlens=lens)
        self.assertFalse(bool(kv.any()))
        # no batch, no query rows: empty outputs; the append still runs with query rows absent
        o, lse = fattn.flash_attn_with_kvcache(q[:, :0], kc1, vc1, k, v, cache_seqlens=lens,
                                               return_softmax_lse=True)
        self.assertEqual((tuple(o.shape), tuple(lse.shape)), ((3, 0, 8, 32), (3, 8, 0)))
        self.assertTrue(torch.equal(kc1[0, 1:3], k[0]))

    def test_signature_is_fa3s(self):
        import inspect
        sig = inspect.signature(fattn.flash_attn_with_kvcache)
        self.assertEqual(list(sig.parameters), FA3_KVCACHE_ARGS)
        defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
        self.assertEqual(defaults["num_splits"], 0)
        self.assertEqual(defaults["window_size"], (-1, -1))
        self.assertEqual(defaults["rotary_interleaved"], True)
        self.assertIn("flash_attn_with_kvcache", fattn.__all__)

    def test_compile(self):
        # a decoding step under torch.compile(fullgraph=True): the op (fattn::fwd_kvcache, mutating the caches)
        # traces without a graph break; outputs and caches as eager
        kc, vc, table = kv_setup(True, seed=23)
        q, k, v = kv_new(sq=1, s_new=1, seed=23)
        lens = torch.tensor([3, 17, 40], dtype=torch.int32)

        def step(q, kc, vc, k, v, lens):
            o = fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table, causal=True)
            return o * 2

        kc2, vc2 = kc.clone(), vc.clone()
        want = step(q, kc, vc, k, v, lens)
        torch._dynamo.reset()
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kc2, vc2, k, v, lens)
        self.assertTrue(torch.equal(got, want))
        self.assertTrue(same_bits(kc2, kc) and same_bits(vc2, vc))

    def test_opcheck(self):
        kc, vc, table = kv_setup(True, b=2, cap=32, d=16, seed=29)
        q, k, v = kv_new(b=2, sq=2, s_new=2, d=16, seed=29)
        lens = torch.tensor([3, 17], dtype=torch.int32)
        for args in ((q, kc, vc, k, v, lens, table, True, 0.25, False),
                     (q, kc[:2 * 2].reshape(2, 32, 2, 16), vc[:4].reshape(2, 32, 2, 16), None, None, lens, None,
                      False, 0.25, True)):
            for name, res in torch.library.opcheck(torch.ops.fattn.fwd_kvcache.default, args).items():
                self.assertEqual(res, "SUCCESS", name)
        # the append by indexing (packed rows) and varlen queries with cache_batch_idx and cache_leftpad
        cu = torch.tensor([0, 1, 3], dtype=torch.int32)
        kp, vp = k.reshape(4, 2, 16)[:3].clone(), v.reshape(4, 2, 16)[:3].clone()
        for op, args in ((torch.ops.fattn.kv_append_rows.default, (kc.clone(), vc.clone(), kp, vp, lens, table, None,
                                                                   cu)),
                         (torch.ops.fattn.fwd_kvcache_varlen.default,
                          (q.reshape(4, 8, 16), kc.reshape(3, 32, 2, 16), vc.reshape(3, 32, 2, 16),
                           torch.tensor([0, 2, 4], dtype=torch.int32), lens, None, 2, True, 0.25, -1, -1, 0.0, None,
                           torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)))):
            for name, res in torch.library.opcheck(op, args).items():
                self.assertEqual(res, "SUCCESS", "%s %s" % (op, name))


def kv_cuda(t):
    return None if t is None else t.cuda()


@unittest.skipUnless(HOPPER, "needs a Hopper GPU")
class KvCacheCuda(unittest.TestCase):
    """flash_attn_with_kvcache on CUDA tensors (the decoding kernel and the CUDA fattn_kv_append): bf16, head
    dim 128, GQA 8/2.  The caches after the call bit for bit those of the same call on CPU copies (the append
    copies bytes); the output within 2e-2 (relative Frobenius) of the float64 reference (bf16 inputs and
    output, as class Cuda), lse within 1e-3 of it on the rows that see keys."""

    def test_matches_reference_and_cpu(self):
        for paged in (False, True):
            for append in (False, True):
                for sq in (1, 3):
                    for causal in (False, True):
                        msg = "paged %s append %s sq %d causal %s" % (paged, append, sq, causal)
                        kc, vc, table = kv_setup(paged, cap=256, d=128, dtype=torch.bfloat16, seed=sq)
                        q, k, v = kv_new(sq=sq, s_new=sq, d=128, dtype=torch.bfloat16, seed=sq)
                        if not append:
                            k = v = None
                        lens = torch.tensor([0, 100, 256 - sq], dtype=torch.int32)
                        want_o, want_lse, want_kc, want_vc = kvcache_reference(q, kc, vc, k, v, lens, table, causal)
                        kcg, vcg = kc.cuda(), vc.cuda()
                        o, lse = fattn.flash_attn_with_kvcache(q.cuda(), kcg, vcg, kv_cuda(k), kv_cuda(v),
                                                               cache_seqlens=lens.cuda(), page_table=kv_cuda(table),
                                                               causal=causal, return_softmax_lse=True)
                        self.assertEqual((o.device.type, o.dtype), ("cuda", torch.bfloat16), msg)
                        self.assertTrue(same_bits(kcg.cpu(), want_kc) and same_bits(vcg.cpu(), want_vc), msg)
                        self.assertLess(rel(o.cpu(), want_o), 2e-2, msg)
                        fin = torch.isfinite(want_lse)
                        self.assertTrue(torch.equal(torch.isfinite(lse.cpu()), fin), msg)
                        torch.testing.assert_close(lse.cpu()[fin], want_lse[fin], rtol=1e-3, atol=1e-3)
                        # an int cache_seqlens and num_splits=1 (no split of the keys): the same values
                        if not append:
                            o1 = fattn.flash_attn_with_kvcache(q.cuda(), kcg, vcg, cache_seqlens=100,
                                                               page_table=kv_cuda(table), causal=causal,
                                                               num_splits=1)
                            w1 = kvcache_reference(q, kc, vc, None, None, 100, table, causal)[0]
                            self.assertLess(rel(o1.cpu(), w1), 2e-2, msg)

    def append_and_attend(self, msg, paged, sq, causal, cap=256, page=16):
        # sq new rows appended to each sequence's cache ([0, 100, cap - sq] rows before), then attended
        kc, vc, table = kv_setup(paged, cap=cap, d=128, page=page, dtype=torch.bfloat16, seed=sq + page)
        q, k, v = kv_new(sq=sq, s_new=sq, d=128, dtype=torch.bfloat16, seed=sq)
        lens = torch.tensor([0, 100, cap - sq], dtype=torch.int32)
        want_o, want_lse, want_kc, want_vc = kvcache_reference(q, kc, vc, k, v, lens, table, causal)
        kcg, vcg = kc.cuda(), vc.cuda()
        o, lse = fattn.flash_attn_with_kvcache(q.cuda(), kcg, vcg, k.cuda(), v.cuda(), cache_seqlens=lens.cuda(),
                                               page_table=kv_cuda(table), causal=causal, return_softmax_lse=True)
        self.assertTrue(same_bits(kcg.cpu(), want_kc) and same_bits(vcg.cpu(), want_vc), msg)
        self.assertLess(rel(o.cpu(), want_o), 2e-2, msg)
        fin = torch.isfinite(want_lse)
        self.assertTrue(torch.equal(torch.isfinite(lse.cpu()), fin), msg)
        torch.testing.assert_close(lse.cpu()[fin], want_lse[fin], rtol=1e-3, atol=1e-3)

    def test_chunked_prefill(self):
        # more query rows than the decoding kernel takes (17, 100; a chunk of a prompt after its earlier
        # chunks, appended as it runs): the varlen kernels' KV-cache instances, through cu_seqlens_q
        for paged in (False, True):
            for sq in (17, 100):
                for causal in (False, True):
                    self.append_and_attend("paged %s sq %d causal %s" % (paged, sq, causal), paged, sq, causal)

    def test_small_pages(self):
        # pages of 1, 3, 4 and 8 keys, decoding and a chunk: the decoding kernel takes pages of 8 (powers of
        # two >= 8); the other pages, and the chunk, run as varlen queries on the cache, whose kernels
        # gather pages of 1, 3 and 4 keys with cp.async (pages of 8: TMA boxes of one swizzle atom)
        for page in (1, 3, 4, 8):
            for sq in (1, 17):
                for causal in (False, True):
                    self.append_and_attend("page %d sq %d causal %s" % (page, sq, causal), True, sq, causal,
                                           cap=240, page=page)

    def test_varlen_queries(self):
        KvCache.check_varlen_q(self, "cuda", 2e-2)

    def test_batch_idx_and_leftpad(self):
        # the decoding shapes run as varlen queries on the cache (the varlen kernels take these fields)
        KvCache.check_batch_idx_and_leftpad(self, "cuda", torch.bfloat16, 2e-2)

    def test_unsupported_shape_raises(self):
        # 17 query rows at head dim 512 (the CPU engine's largest): neither the decoding kernel nor the
        # varlen kernels have it: the library's UNSUPPORTED as a Python exception
        kc, vc, table = kv_setup(True, cap=64, d=512, page=8, dtype=torch.bfloat16, device="cuda")
        q = torch.randn(3, 17, 8, 512, dtype=torch.bfloat16, device="cuda")
        with self.assertRaises(fattn.FattnUnsupportedError):
            fattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, page_table=table)

    def test_graph_and_no_host_synchronisation(self):
        # a decoding step captured in a CUDA graph, replayed with new q, k, v and lengths against eager calls;
        # and an eager step does not wait for the GPU (a sleep queued before it is still running on return)
        kc, vc, table = kv_setup(True, cap=256, d=128, dtype=torch.bfloat16, device="cuda", seed=3)
        q, k, v = (t.cuda() for t in kv_new(sq=1, s_new=1, d=128, dtype=torch.bfloat16, seed=3))
        lens = torch.tensor([10, 50, 90], dtype=torch.int32, device="cuda")
        step = lambda: fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, page_table=table,  # noqa
                                                     causal=True)
        g, o = capture(step)
        for seed in (1, 2):
            new = kv_new(sq=1, s_new=1, d=128, dtype=torch.bfloat16, seed=seed)
            for t, n in zip((q, k, v), new):
                t.copy_(n)
            lens.add_(1)
            kc0, vc0 = kc.clone(), vc.clone()
            g.replay()
            kc1, vc1 = kc.clone(), vc.clone()
            kc.copy_(kc0)
            vc.copy_(vc0)
            want = step()
            self.assertTrue(same_bits(o, want))
            self.assertTrue(same_bits(kc, kc1) and same_bits(vc, vc1))
        del g

        def calls():
            step()
            fattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=7, page_table=table)  # an int

        self.assertTrue(returns_before_gpu(calls, warmup=step), "the call waited for the GPU")


# ---------------------------------------------------------------------------
# fattn.flash_attn_varlen_func: packed variable-length batches (cu_seqlens)
# ---------------------------------------------------------------------------

def varlen_reference(q, k, v, cu_q, cu_k, causal=False, scale=None, seqused_k=None):
    """(out [total_q, hq, dv], lse [hq, total_q]) of a packed variable-length batch, one sequence at a time
    through torch's SDPA (the math kernel) in the inputs' dtype, differentiable; FlashAttention's causal mask
    bottom-right aligned on each sequence (key j seen by query i iff j <= i + len_k - len_q, len_k the
    sequence's keys, its first seqused_k[b] with seqused_k).  Rows that see no key are left out of the SDPA
    call (its softmax would be NaN, and so would every gradient through it) and give 0 and lse -inf.  The
    lse is the logsumexp of the same scaled, masked scores."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    hq, hkv, dv = q.shape[1], k.shape[1], v.shape[2]
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else scale
    cq, ck = cu_q.tolist(), cu_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qb, kb, vb = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        if seqused_k is not None:
            kb, vb = kb[:int(seqused_k[b])], vb[:int(seqused_k[b])]
        lq, lk = qb.shape[0], kb.shape[0]
        i0 = lq if lk == 0 else (max(lq - lk, 0) if causal else 0)  # rows < i0 see no key
        outs.append(q.new_zeros((i0, hq, dv)))
        lses.append(torch.full((hq, i0), float("-inf"), dtype=torch.float64))
        if i0 == lq:
            continue
        qs = qb[i0:].transpose(0, 1)[None]  # [1, hq, n, d]
        ks, vs = (x.repeat_interleave(hq // hkv, 1).transpose(0, 1)[None] for x in (kb, vb))
        mask = None
        if causal:
            mask = torch.arange(lk)[None, :] <= torch.arange(i0, lq)[:, None] + lk - lq
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
        outs.append(o[0].transpose(0, 1))
        sc = (qs.double() @ ks.double().transpose(-1, -2))[0] * scale
        if mask is not None:
            sc = sc.masked_fill(~mask, float("-inf"))
        lses.append(sc.logsumexp(-1).detach())
    return torch.cat(outs), torch.cat(lses, 1)


def varlen_inputs(seqs, hq=4, hkv=2, d=32, dv=None, dtype=torch.float32, device="cpu", seed=0):
    """q [total_q, hq, d], k, v [total_k, hkv, d (dv)] of the (len_q, len_k) pairs `seqs`, N(0, 1);
    cu_seqlens_q, cu_seqlens_k int32; max_seqlen_q, max_seqlen_k."""
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    lq, lk = [a for a, _ in seqs], [b for _, b in seqs]
    cu = [torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device) for lens in (lq, lk)]
    q, k, v = (torch.randn(s, generator=g).to(device=device, dtype=dtype)
               for s in ((sum(lq), hq, d), (sum(lk), hkv, d), (sum(lk), hkv, dv)))
    return q, k, v, cu[0], cu[1], max(lq), max(lk)


# Ragged batches: an empty sequence, no keys (its rows see none), no queries, length 1, lengths that are not
# multiples of 64 (and 64, 129), len_q > len_k (the first causal rows see no key) and len_q < len_k.
VARLEN_SEQS = [(37, 50), (0, 0), (1, 1), (130, 100), (5, 0), (0, 7), (64, 129), (20, 3)]
VARLEN_SHAPES = [dict(hq=4, hkv=2, d=32), dict(hq=6, hkv=1, d=24, dv=40), dict(hq=3, hkv=3, d=16)]
FA3_VARLEN_ARGS = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seqused_q",
                   "seqused_k", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
                   "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic",
                   "sm_margin", "return_attn_probs", "learnable_sink"]  # FA3's, then FA4's sink


def varlen_grads(q, k, v, dout, cu_q, cu_k, mq, mk, causal):
    """(o, dq, dk, dv) of fattn.flash_attn_varlen_func, of the reference in the inputs' dtype (the
    peer) and of the reference in float64 (the truth), for the same dout."""
    ref = lambda a, b, c: varlen_reference(a, b, c, cu_q, cu_k, causal)[0]  # noqa: E731
    want = grads(ref, q.double(), k.double(), v.double(), dout.double())
    peer = grads(ref, q, k, v, dout)
    got = grads(lambda a, b, c: fattn.flash_attn_varlen_func(a, b, c, cu_q, cu_k, mq, mk, causal=causal), q, k, v, dout)
    return got, peer, want


def seqused_rows(cu, used):
    """(rows, cu2): the packed rows each sequence of cu_seqlens `cu` uses, its first min(used[b], its
    length) (used None: all), and the cu_seqlens of those rows alone (int32, on the CPU)."""
    cu = cu.cpu().tolist()
    lens = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    n = lens if used is None else [min(int(u), m) for u, m in zip(used, lens)]
    rows = torch.cat([torch.arange(cu[b], cu[b] + n[b]) for b in range(len(n))] + [torch.zeros(0, dtype=torch.long)])
    return rows, torch.tensor([0] + n).cumsum(0).to(torch.int32)


def seqused_grads(q, k, v, dout, cu_q, cu_k, mq, mk, causal, used_q, used_k, deterministic=False):
    """(dq, dk, dv) of fattn.flash_attn_varlen_func with seqused_q / seqused_k (int32 CPU tensors or None;
    sent to q's device), then of varlen_reference on only the used rows in the inputs' dtype (the peer) and
    in float64 (the truth): rows that take no part get gradient 0 there (index_select's backward)."""
    rq, cq2 = seqused_rows(cu_q, used_q)
    rk, ck2 = seqused_rows(cu_k, used_k)

    def ref(a, b, c):  # the full-size output, the unused rows 0 (never compared: their dout is dropped)
        o = varlen_reference(a[rq], b[rk], c[rk], cq2, ck2, causal)[0]
        return a.new_zeros(a.shape[:2] + (c.shape[2],)).index_copy(0, rq, o)

    cpu = lambda t: t.detach().cpu()  # noqa: E731
    want = grads(ref, cpu(q).double(), cpu(k).double(), cpu(v).double(), cpu(dout).double())[1:]
    peer = grads(ref, cpu(q), cpu(k), cpu(v), cpu(dout))[1:]
    dev = lambda t: None if t is None else t.to(q.device)  # noqa: E731
    got = grads(lambda a, b, c: fattn.flash_attn_varlen_func(a, b, c, cu_q, cu_k, mq, mk, causal=causal,
                                                             deterministic=deterministic, seqused_q=dev(used_q),
                                                             seqused_k=dev(used_k)), q, k, v, dout)[1:]
    return got, peer, want, (rq, rk, rk)


# ---------------------------------------------------------------------------
# An FP8 KV cache (fattn.h 0.5): float8_e4m3fn caches with k_scale / v_scale
# ---------------------------------------------------------------------------

def kv8_quantise(cache, per_token):
    """(codes float8_e4m3fn, scales float32) of a float cache [e, rows, hkv, d]: scales [e, hkv, rows]
    (per token) or [e, hkv] (per page or sequence), max(amax / 448, 2^-126); the codes by torch's
    conversion of x / scale (|x / scale| <= 448 up to a rounding)."""
    x = cache.float()
    amax = x.abs().amax(dim=3) if per_token else x.abs().amax(dim=(1, 3))  # [e, rows, hkv] or [e, hkv]
    scale = (amax / 448.0).clamp_min(2.0 ** -126)
    bc = scale[..., None] if per_token else scale[:, None, :, None]
    codes = (x / bc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return codes, (scale.permute(0, 2, 1).contiguous() if per_token else scale.contiguous())


def kv8_values(codes, scale):
    """The float64 values of an e4m3 cache [e, rows, hkv, d] with scales [e, hkv, rows] or [e, hkv]."""
    bc = scale.double().permute(0, 2, 1)[..., None] if scale.dim() == 3 else scale.double()[:, None, :, None]
    return codes.double() * bc


class KvCache8(unittest.TestCase):
    """flash_attn_with_kvcache with an FP8 cache on CPU tensors (the CPU engine): the output against the
    float64 reference over the dequantised cache (code x scale): the quantisation is in the reference, so
    the tolerance is the query dtype's (float32 1e-5; bf16 output 2e-2 relative).  An append quantises the
    new rows: each within e4m3's rounding (2^-4 of the element, or 2^-10 of the block's amax near zero)
    of the row appended, per-token scales amax / 448, and the forward then sees the dequantised rows."""

    def run_case(self, paged, per_token, append, sq, causal, dtype, device="cpu", d=32):
        kc, vc, table = kv_setup(paged, cap=64, d=d, seed=sq + 10 * per_token)
        q, k, v = kv_new(sq=sq, s_new=sq, d=d, dtype=dtype, seed=sq)
        kc8, ks = kv8_quantise(kc, per_token)
        vc8, vs = kv8_quantise(vc, per_token)
        lens = torch.tensor([0, 17, 64 - sq], dtype=torch.int32)
        if not append:
            k = v = None
        dev = lambda t: None if t is None else t.to(device)  # noqa: E731
        kcd, vcd, ksd, vsd = dev(kc8), dev(vc8), dev(ks), dev(vs)
        o, lse = fattn.flash_attn_with_kvcache(dev(q), kcd, vcd, dev(k), dev(v), cache_seqlens=dev(lens),
                                               page_table=dev(table), causal=causal, return_softmax_lse=True,
                                               k_scale=ksd, v_scale=vsd)
        kcd, vcd, ksd, vsd, o, lse = (t.cpu() for t in (kcd, vcd, ksd, vsd, o, lse))
        kvals, vvals = kv8_values(kcd, ksd), kv8_values(vcd, vsd)
        if append:  # the appended rows, read back through the table
            for bi in range(3):
                for t in range(sq):
                    pos = int(lens[bi]) + t
                    e, r = (int(table[bi, pos // 16]), pos % 16) if paged else (bi, pos)
                    for name, got, x in (("k", kvals[e, r], k[bi, t]), ("v", vvals[e, r], v[bi, t])):
                        x = x.double()
                        err = (got - x).abs()
                        bound = x.abs() * 2.0 ** -4 + x.abs().amax() * 2.0 ** -10 + 1e-30
                        if per_token or r == 0:
                            self.assertTrue(bool((err <= bound).all()), "%s row %d of sequence %d" % (name, pos, bi))
        want_o, want_lse, _, _ = kvcache_reference(q.double(), kvals, vvals, None, None,
                                                   lens + (sq if append else 0), table, causal)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        msg = "paged %s per_token %s append %s sq %d causal %s %s %s" % (paged, per_token, append, sq, causal,
                                                                          dtype, device)
        self.assertEqual(o.dtype, dtype, msg)
        self.assertLess(rel(o, want_o), tol, msg)
        fin = torch.isfinite(want_lse)
        self.assertTrue(torch.equal(torch.isfinite(lse), fin), msg)
        # the CUDA prefill kernels stage code x scale rounded to q's dtype (fattn.h): bf16's 2^-9 on each K
        # value moves a score of size ~3 by up to ~6e-3 (measured 2.6e-3 on the LSE, 2 rows of 768)
        lse_tol = 1e-2 if device != "cpu" and dtype == torch.bfloat16 and sq > 16 else 1e-3
        torch.testing.assert_close(lse[fin].double(), want_lse[fin].double(), rtol=1e-3, atol=lse_tol, msg=msg)
        return kcd, vcd, ksd, vsd, o

    def test_matches_reference(self):
        for paged in (False, True):
            for per_token in (False, True):
                for append in (False, True):
                    for sq, causal in ((1, False), (3, True)):
                        self.run_case(paged, per_token, append, sq, causal, torch.float32)
        self.run_case(True, True, True, 1, False, torch.bfloat16)

    def test_refusals(self):
        kc, vc, table = kv_setup(True, cap=64, d=32)
        q, _, _ = kv_new(d=32)
        kc8, ks = kv8_quantise(kc, True)
        vc8, vs = kv8_quantise(vc, True)
        lens = torch.tensor([5, 6, 7], dtype=torch.int32)
        call = lambda **kw: fattn.flash_attn_with_kvcache(q, kw.pop("kc", kc8), kw.pop("vc", vc8),  # noqa: E731
                                                          cache_seqlens=lens, page_table=table, **kw)
        with self.assertRaisesRegex(ValueError, "k_scale and v_scale go with a float8_e4m3fn"):
            fattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, k_scale=ks, v_scale=vs)
        with self.assertRaisesRegex(ValueError, "needs v_scale"):
            call(k_scale=ks)
        with self.assertRaisesRegex(TypeError, "must both be float8_e4m3fn"):
            call(vc=vc, k_scale=ks, v_scale=vs)
        with self.assertRaisesRegex(ValueError, "k_scale must be a contiguous float32"):
            call(k_scale=ks.double(), v_scale=vs)
        with self.assertRaisesRegex(ValueError, "v_scale must be a contiguous float32"):
            call(k_scale=ks, v_scale=vs[:, :1])
        bad = vs.clone()
        bad[int(table[0, 0]), 0, 2] = 0.0  # a used key's scale
        with self.assertRaisesRegex(fattn.FattnError, "v.scale"):
            call(k_scale=ks, v_scale=bad)


@unittest.skipUnless(HOPPER, "needs a Hopper GPU")
class KvCache8Cuda(unittest.TestCase):
    """The FP8 cache on CUDA tensors (the decoding kernel's KV8 instances and the CUDA fattn_kv_append): bf16
    and f16 q, head dim 128, GQA 8/2; the output within 2e-2 of the float64 reference over the dequantised
    cache; the caches and scales after an append bit for bit those of the same call on CPU copies (one
    quantiser); longer queries on the paged prefill's KV8 instances."""

    def test_matches_reference_and_cpu(self):
        for paged in (False, True):
            for per_token in (False, True):
                for sq, causal in ((1, False), (3, True)):
                    for dtype in (torch.bfloat16, torch.float16):
                        g = KvCache8("run_case")
                        gpu = g.run_case(paged, per_token, True, sq, causal, dtype, device="cuda", d=128)
                        cpu = g.run_case(paged, per_token, True, sq, causal, dtype, device="cpu", d=128)
                        for a, b in zip(gpu[:4], cpu[:4]):
                            self.assertTrue(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                                        b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b))

    def test_prefill(self):
        """32 query rows (past the decoding kernel): the paged prefill's KV8 instances, through the same
        call (fixed-length queries become a varlen batch on the cache), and cu_seqlens_q directly."""
        g = KvCache8("run_case")
        for paged in (False, True):
            for per_token in (False, True):
                for causal, dtype in ((True, torch.bfloat16), (False, torch.float16)):
                    g.run_case(paged, per_token, True, 32, causal, dtype, device="cuda", d=128)
        for d in (64, 256):
            g.run_case(True, True, False, 20, True, torch.bfloat16, device="cuda", d=d)
        kc, vc, table = kv_setup(True, cap=64, d=128, page=4, device="cuda", seed=5)
        kc8, ks = kv8_quantise(kc, False)
        vc8, vs = kv8_quantise(vc, True)
        lens = torch.tensor([30, 64, 9], dtype=torch.int32)
        cu = torch.tensor([0, 5, 45, 54], dtype=torch.int32)
        q = torch.randn(54, 8, 128, device="cuda", dtype=torch.bfloat16)
        o = fattn.flash_attn_with_kvcache(q, kc8, vc8, cache_seqlens=lens.cuda(), page_table=table, causal=True,
                                          cu_seqlens_q=cu.cuda(), max_seqlen_q=40, k_scale=ks, v_scale=vs)
        kvals, vvals = kv8_values(kc8.cpu(), ks.cpu()), kv8_values(vc8.cpu(), vs.cpu())
        for bi in range(3):
            a, e = int(cu[bi]), int(cu[bi + 1])
            want, _, _, _ = kvcache_reference(q[a:e].cpu().double()[None], kvals, vvals, None, None,
                                              lens[bi:bi + 1], table[bi:bi + 1].cpu(), True)
            self.assertLess(rel(o[a:e].cpu()[None], want), 2e-2, "varlen sequence %d" % bi)


def chunk_reference(q, k, v, causal, window, chunk):
    """reference's (out, lse) in float64 with FA3's attention_chunk; window None: none."""
    return reference(q.double(), k.double(), v.double(), causal, window=window or (-1, -1), return_lse=True,
                     chunk=chunk)


class AttentionChunk(unittest.TestCase):
    """FA3's attention_chunk through flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache on
    CPU tensors (the call on a finer varlen batch, python/fattn/_chunk.py) against chunk_reference in float64:
    out (f32 1e-5 relative), lse on the rows that see keys, -inf and 0 on the others, the gradients of q, k,
    v within 1e-4 relative; chunks smaller than, equal to and larger than the sequences, causal, a window,
    more queries than keys and the reverse, GQA."""

    CASES = [dict(sq=37, sk=45, chunk=8, causal=True, window=None),
             dict(sq=45, sk=37, chunk=5, causal=True, window=None),
             dict(sq=20, sk=50, chunk=64, causal=True, window=None),
             dict(sq=33, sk=33, chunk=1, causal=True, window=None),
             dict(sq=30, sk=61, chunk=16, causal=False, window=(7, 3)), dict(sq=50, sk=20, chunk=7, causal=False,
                                                                          window=(-1, 4))]

    def test_func(self):
        for c in self.CASES:
            q, k, v = inputs(b=2, sq=c["sq"], sk=c["sk"], hq=4, hkv=2, d=16, seed=c["chunk"])
            do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
            ws = c["window"] if c["window"] is not None else (-1, -1)
            got = grads(lambda a, b_, c_: fattn.flash_attn_func(a, b_, c_, causal=c["causal"], window_size=ws,
                                                                attention_chunk=c["chunk"]), q, k, v, do)
            want = grads(lambda a, b_, c_: chunk_reference(a, b_, c_, c["causal"], c["window"], c["chunk"])[0],
                         q, k, v, do.double())
            for n, x, y in zip(("out", "dq", "dk", "dv"), got, want):
                # chunk 1: one key a row, P = 1 and dq = 0 up to rounding: relative to |y| or 1
                err = (x.double() - y).norm().item() / max(y.norm().item(), 1.0)
                self.assertLess(err, 1e-4 if n != "out" else 1e-5, "%s %s" % (c, n))
            o, lse = fattn.flash_attn_func(q, k, v, causal=c["causal"], window_size=ws, attention_chunk=c["chunk"],
                                           return_attn_probs=True)
            _, wl = chunk_reference(q, k, v, c["causal"], c["window"], c["chunk"])
            fin = torch.isfinite(wl)
            self.assertTrue(torch.equal(torch.isfinite(lse), fin), str(c))
            torch.testing.assert_close(lse[fin].double(), wl[fin], rtol=1e-5, atol=1e-5)
            self.assertTrue(bool((o.permute(0, 2, 1, 3)[~fin] == 0).all()), str(c))

    def test_varlen(self):
        lens_q, lens_k = [5, 0, 40, 17], [9, 12, 33, 17]
        cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
        cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
        g = torch.Generator().manual_seed(4)
        q, do = torch.randn(int(cu_q[-1]), 4, 16, generator=g), torch.randn(int(cu_q[-1]), 4, 16, generator=g)
        k, v = torch.randn(int(cu_k[-1]), 2, 16, generator=g), torch.randn(int(cu_k[-1]), 2, 16, generator=g)
        for chunk, causal in ((6, True), (13, False), (100, True)):
            got = grads(lambda a, b_, c_: fattn.flash_attn_varlen_func(a, b_, c_, cu_q, cu_k, 40, 33, causal=causal,
                                                                       attention_chunk=chunk), q, k, v, do)
            for i in range(4):
                qa, qb, ka, kb = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
                if qb == qa:
                    continue
                want = grads(lambda a, b_, c_: chunk_reference(a[None], b_[None], c_[None], causal, None, chunk)[0][0],
                             q[qa:qb], k[ka:kb], v[ka:kb], do[qa:qb].double())
                for n, x, y in zip(("out", "dq"), (got[0][qa:qb], got[1][qa:qb]), want[:2]):
                    self.assertLess(rel(x, y), 1e-4, "chunk %d sequence %d %s" % (chunk, i, n))
                for n, x, y in zip(("dk", "dv"), (got[2][ka:kb], got[3][ka:kb]), want[2:]):
                    self.assertLess(rel(x, y), 1e-4, "chunk %d sequence %d %s" % (chunk, i, n))

    def test_kvcache(self):
        for paged, leftpad, chunk in ((False, False, 8), (True, False, 5), (False, True, 16), (True, True, 3)):
            kc, vc, table = kv_setup(paged, cap=64, d=32, seed=chunk)
            q, k, v = kv_new(sq=6, s_new=6, d=32, seed=chunk)
            lens = torch.tensor([10, 0, 50], dtype=torch.int32)
            pad = torch.tensor([3, 0, 20], dtype=torch.int32) if leftpad else None
            o, lse = fattn.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), k, v, cache_seqlens=lens,
                                                   page_table=table, cache_leftpad=pad, causal=True,
                                                   attention_chunk=chunk, return_softmax_lse=True)
            _, _, kc2, vc2 = kvcache_reference(q.double(), kc.double(), vc.double(), k.double(), v.double(), lens,
                                               table, True, cache_leftpad=pad)
            for bi in range(3):
                p0 = int(pad[bi]) if pad is not None else 0
                keys = torch.arange(p0, int(lens[bi]) + 6)
                if table is None:
                    kk, vv = kc2[bi, keys], vc2[bi, keys]
                else:
                    pg = table[bi].long()[keys // 16]
                    kk, vv = kc2[pg, keys % 16], vc2[pg, keys % 16]
                want, wl = chunk_reference(q[bi:bi + 1], kk[None], vv[None], True, None, chunk)
                self.assertLess(rel(o[bi:bi + 1], want), 1e-5, "paged %s pad %s chunk %d b %d" % (paged, leftpad,
                                                                                                   chunk, bi))
                torch.testing.assert_close(lse[bi:bi + 1].double(), wl, rtol=1e-5, atol=1e-5)

    def test_refusals(self):
        q, k, v = inputs()
        with self.assertRaisesRegex(ValueError, "attention_chunk must be an int >= 0"):
            fattn.flash_attn_func(q, k, v, causal=True, attention_chunk=-4)


class Varlen(unittest.TestCase):
    """fattn.flash_attn_varlen_func on CPU tensors against varlen_reference in float64: out within Forward's
    tolerances (relative Frobenius: f32 1e-5, f16 3e-3, bf16 2e-2), lse (f32 inside on every dtype) within
    1e-5 on the rows that see keys and -inf exactly on the others; gradients as Backward's (f32: within 2x
    the f32 reference's own error + 1e-6; 16-bit: within 2x the relative error of SDPA on the 16-bit
    inputs)."""

    def check_forward(self, msg, q, k, v, cu_q, cu_k, mq, mk, causal, tol, scale=None, **kw):
        o, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, softmax_scale=scale,
                                              return_attn_probs=True, **kw)
        want, want_lse = varlen_reference(q.double(), k.double(), v.double(), cu_q, cu_k, causal, scale,
                                          kw.get("seqused_k"))
        self.assertEqual((o.dtype, tuple(o.shape)), (q.dtype, tuple(q.shape[:2]) + (v.shape[2],)), msg)
        self.assertEqual((lse.dtype, tuple(lse.shape)), (torch.float32, (q.shape[1], q.shape[0])), msg)
        self.assertLess(rel(o, want), tol, msg)
        fin = torch.isfinite(want_lse)
        self.assertTrue(torch.equal(torch.isfinite(lse), fin), msg)
        self.assertTrue(bool((o.view(-1, *o.shape[1:]).transpose(0, 1)[~fin] == 0).all()), msg)  # no key: 0
        torch.testing.assert_close(lse[fin].double(), want_lse[fin], rtol=1e-5, atol=1e-5,
                                   msg=lambda m: "%s: %s" % (msg, m))
        return o, lse

    def test_matches_reference(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
            for n, shape in enumerate(VARLEN_SHAPES):
                ts = varlen_inputs(VARLEN_SEQS, dtype=dtype, seed=n, **shape)
                for causal in (False, True):
                    self.check_forward("%s %s causal %s" % (dtype, shape, causal), *ts, causal, tol)

    def test_scale_max_seqlen_and_one_sequence(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=3)
        self.check_forward("scale", q, k, v, cu_q, cu_k, mq, mk, True, 1e-5, scale=0.3)
        # max_seqlen larger than every sequence (an upper bound, as FA3's): the same values
        want = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
        got = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq + 100, mk + 3, causal=True)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        # one sequence is the dense call on it; a uniform batch is flash_attn_func's on [b, s, h, d]
        for causal in (False, True):
            q1, k1, v1, cq1, ck1, mq1, mk1 = varlen_inputs([(70, 90)], seed=4)
            o1 = fattn.flash_attn_varlen_func(q1, k1, v1, cq1, ck1, mq1, mk1, causal=causal)
            torch.testing.assert_close(o1, fattn.attention(q1[None], k1[None], v1[None], causal)[0],
                                       rtol=1e-6, atol=1e-6)
            qu, ku, vu, cqu, cku, mqu, mku = varlen_inputs([(33, 41)] * 3, seed=5)
            ou, lu = fattn.flash_attn_varlen_func(qu, ku, vu, cqu, cku, mqu, mku, causal=causal,
                                                  return_attn_probs=True)
            od, ld = fattn.flash_attn_func(qu.view(3, 33, 4, 32), ku.view(3, 41, 2, 32), vu.view(3, 41, 2, 32),
                                           causal=causal, return_attn_probs=True)
            torch.testing.assert_close(ou, od.reshape(99, 4, 32), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(lu, ld.transpose(0, 1).reshape(4, 99), rtol=1e-6, atol=1e-6)

    def test_layouts(self):
        # strided q, k, v (slices of one packed qkv buffer, a head dim that is not contiguous: copied)
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs([(40, 40), (17, 17)], hq=2, hkv=2, d=16)
        want = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
        qkv = torch.stack([q, k, v], 1)  # [total, 3, h, d]
        got = fattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_q, cu_k, mq, mk, causal=True)
        self.assertTrue(torch.equal(got, want))
        qt = q.transpose(1, 2).contiguous().transpose(1, 2)
        self.assertTrue(torch.equal(fattn.flash_attn_varlen_func(qt, k, v, cu_q, cu_k, mq, mk, causal=True), want))

    def test_backward_f32(self):
        for n, shape in enumerate(VARLEN_SHAPES[:2]):
            q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=10 + n, **shape)
            dout = torch.randn(q.shape[:2] + (v.shape[2],), generator=torch.Generator().manual_seed(n))
            for causal in (False, True):
                msg = "%s causal %s" % (shape, causal)
                got, peer, want = varlen_grads(q, k, v, dout, cu_q, cu_k, mq, mk, causal)
                for name, g, p, w in zip(("o", "dq", "dk", "dv"), got, peer, want):
                    self.assertEqual(g.dtype, torch.float32)
                    err, peer_err = (g.double() - w).norm().item(), (p.double() - w).norm().item()
                    self.assertLessEqual(err, 2 * peer_err + 1e-6 * max(w.norm().item(), 1.0), (name, msg))

    def test_backward_16bit(self):
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, dtype=dtype, seed=20)
            dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
            for causal in (False, True):
                got, peer, want = varlen_grads(q, k, v, dout, cu_q, cu_k, mq, mk, causal)
                for name, g, p, w in zip(("o", "dq", "dk", "dv"), got, peer, want):
                    self.assertEqual(g.dtype, dtype)
                    self.assertLessEqual(rel(g, w), 2 * rel(p, w), (name, dtype, causal))

    def test_lse_and_empty(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=30)
        q.requires_grad_(True)
        o, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_attn_probs=True)
        self.assertTrue(o.requires_grad)
        self.assertFalse(lse.requires_grad)  # as flash_attn_func's: no gradient through the lse
        self.assertTrue(torch.equal(fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True), o))
        (o.sum() + lse.sum()).backward()
        self.assertIsNotNone(q.grad)
        # no query or no key anywhere in the batch: nothing computed, 0 and -inf; zero gradients
        for seqs in ([(0, 5), (0, 0)], [(3, 0), (4, 0)]):
            q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(seqs)
            ts = [t.requires_grad_(True) for t in (q, k, v)]
            o, lse = fattn.flash_attn_varlen_func(*ts, cu_q, cu_k, mq, mk, return_attn_probs=True)
            self.assertEqual((tuple(o.shape), tuple(lse.shape)), ((q.shape[0], 4, 32), (4, q.shape[0])))
            self.assertTrue(bool((o == 0).all()) and bool(torch.isneginf(lse).all()))
            o.sum().backward()
            self.assertTrue(all(bool((t.grad == 0).all()) for t in ts))

    def test_seqused_k(self):
        # sequence b uses its first seqused_k[b] keys (the CPU engine serves it with cu_seqlens); the keys
        # past them hold NaN and never reach the output (their gradients: test_seqused_grads)
        seqs = [(10, 30), (0, 4), (25, 20), (1, 9)]
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(seqs, seed=40)
        used = torch.tensor([12, 4, 0, 9], dtype=torch.int32)
        for b, n in enumerate(used.tolist()):
            k[cu_k[b] + n:cu_k[b + 1]] = float("nan")
            v[cu_k[b] + n:cu_k[b + 1]] = float("nan")
        for causal in (False, True):
            o, _ = self.check_forward("causal %s" % causal, q, k, v, cu_q, cu_k, mq, mk, causal, 1e-5,
                                      seqused_k=used)
            self.assertTrue(bool(torch.isfinite(o).all()))
        # the op called directly: its backward gets seqused_k too (the NaN keys reach no gradient)
        q.requires_grad_(True)
        o, _ = torch.ops.fattn.fwd_varlen(q, k, v, cu_q, cu_k, used, mq, mk, False, 0.25, False)
        o.sum().backward()
        self.assertTrue(bool(torch.isfinite(q.grad).all()))

    def check_seqused_grads(self, device, dtype, shapes, used_q, used_k, seqs, check, nan=False, dets=(False,)):
        """Gradients with seqused_q and seqused_k (fattn_bwd_args) against seqused_grads' float64
        reference: `check(msg, got, peer, want)` on each of dq, dk, dv; the rows that take no part exactly
        0.  nan: the unused rows of q, k, v and dout hold NaN (the CPU engine reads none of them)."""
        for n, shape in enumerate(shapes):
            q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(seqs, dtype=dtype, seed=70 + n, **shape)
            dout = torch.randn(q.shape[:2] + (v.shape[2],), generator=torch.Generator().manual_seed(n)).to(dtype)
            uq, uk = (None if u is None else torch.tensor(u, dtype=torch.int32) for u in (used_q, used_k))
            if nan:
                for t, cu, u in ((q, cu_q, uq), (dout, cu_q, uq), (k, cu_k, uk), (v, cu_k, uk)):
                    keep = torch.zeros(t.shape[0], dtype=torch.bool)
                    keep[seqused_rows(cu, u)[0]] = True
                    t[~keep] = float("nan")
            q, k, v, dout, cu_q, cu_k = (t.to(device) for t in (q, k, v, dout, cu_q, cu_k))
            for causal in (False, True):
                for det in dets:
                    msg = "%s %s causal %s det %s" % (dtype, shape, causal, det)
                    got, peer, want, rows = seqused_grads(q, k, v, dout, cu_q, cu_k, mq, mk, causal, uq, uk, det)
                    for name, g, p, w, r in zip(("dq", "dk", "dv"), got, peer, want, rows):
                        g = g.cpu()
                        self.assertEqual((g.dtype, g.shape), (dtype, w.shape), (name, msg))
                        unused = torch.ones(g.shape[0], dtype=torch.bool)
                        unused[r] = False
                        self.assertTrue(bool((g[unused] == 0).all()), ("unused rows not 0", name, msg))
                        check("%s %s" % (name, msg), g[r], p[r], w[r])

    def check_f32(self, msg, g, p, w):  # Backward's: 2x the f32 reference's own error + 1e-6
        err, peer_err = (g.double() - w).norm().item(), (p.double() - w).norm().item()
        self.assertLessEqual(err, 2 * peer_err + 1e-6 * max(w.norm().item(), 1.0), msg)

    def check_16bit(self, msg, g, p, w):  # Backward's: 2x the 16-bit reference's relative error
        self.assertLessEqual(rel(g, w), 2 * rel(p, w) + 1e-6, msg)

    # seqused_q and seqused_k of the gradients: fewer rows than the sequence has, none, one, all, more than
    # it has; VARLEN_SEQS has empty sequences, no keys, no queries, length 1, tails past 64
    SEQUSED_Q = [20, 0, 1, 200, 3, 0, 17, 5]
    SEQUSED_K = [49, 0, 0, 64, 0, 7, 1, 100]

    def test_seqused_grads(self):
        self.check_seqused_grads("cpu", torch.float32, VARLEN_SHAPES[:2], self.SEQUSED_Q, self.SEQUSED_K,
                                 VARLEN_SEQS, self.check_f32, nan=True)
        for uq, uk in ((self.SEQUSED_Q, None), (None, self.SEQUSED_K)):  # one of the two
            self.check_seqused_grads("cpu", torch.float32, VARLEN_SHAPES[:1], uq, uk, VARLEN_SEQS, self.check_f32,
                                     nan=True)
        for dtype in (torch.float16, torch.bfloat16):
            self.check_seqused_grads("cpu", dtype, VARLEN_SHAPES[:1], self.SEQUSED_Q, self.SEQUSED_K, VARLEN_SEQS,
                                     self.check_16bit)

    def test_seqused_grads_compile(self):
        # the op's autograd with seqused_q, seqused_k under torch.compile(fullgraph=True): eager's bits
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=61)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
        uq, uk = (torch.tensor(u, dtype=torch.int32) for u in (self.SEQUSED_Q, self.SEQUSED_K))

        def f(q, k, v):
            return fattn.flash_attn_varlen_func(q * 1.5, k, v, cu_q, cu_k, mq, mk, causal=True, seqused_q=uq,
                                                seqused_k=uk)

        want = grads(f, q, k, v, dout)
        torch._dynamo.reset()
        got = grads(torch.compile(f, fullgraph=True, backend="aot_eager"), q, k, v, dout)
        rq = seqused_rows(cu_q, uq)[0]
        self.assertTrue(torch.equal(got[0][rq], want[0][rq]), "o")  # the rows past seqused_q are not written
        for name, a, w in zip(("dq", "dk", "dv"), got[1:], want[1:]):
            self.assertTrue(torch.equal(a, w), name)

    def test_hints_change_nothing(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=50)
        want = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_attn_probs=True)
        for hint in (dict(num_splits=0), dict(num_splits=1), dict(num_splits=3), dict(pack_gqa=True),
                     dict(pack_gqa=False),
                     dict(deterministic=True), dict(window_size=[-1, -1]), dict(sm_margin=0),
                     dict(causal=False, window_size=(-1, 0))):
            kw = dict(causal=True)
            kw.update(hint)
            got = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, return_attn_probs=True, **kw)
            self.assertTrue(same_bits(got[0], want[0]) and same_bits(got[1], want[1]), hint)

    def check_seqused_q(self, device, dtype, tol, d=32):
        # FA3's seqused_q: sequence b computes its first used[b] queries (fewer, none, all, more than it has),
        # against varlen_reference on just those queries; the other rows are not compared (FA3 promises nothing)
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, d=d, dtype=dtype, device=device, seed=9)
        used = [20, 0, 1, 200, 0, 3, 64, 5]
        lq = [a for a, _ in VARLEN_SEQS]
        for causal in (False, True):
            o, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_attn_probs=True,
                                                  seqused_q=torch.tensor(used, dtype=torch.int32, device=device))
            keep = torch.cat([torch.arange(int(cu_q[b]), int(cu_q[b]) + min(used[b], lq[b])) for b in range(len(lq))])
            cu2 = torch.tensor([0] + [min(u, n) for u, n in zip(used, lq)]).cumsum(0).to(torch.int32)
            ro, rl = varlen_reference(q.cpu()[keep].double(), k.cpu().double(), v.cpu().double(), cu2, cu_k.cpu(),
                                      causal)
            self.assertLess(rel(o.cpu()[keep], ro), tol, (device, causal))
            fin = torch.isfinite(rl)
            self.assertTrue(torch.equal(torch.isfinite(lse.cpu()[:, keep]), fin))
            torch.testing.assert_close(lse.cpu()[:, keep][fin].double(), rl[fin], rtol=1e-3, atol=1e-3)

    def test_seqused_q(self):
        self.check_seqused_q("cpu", torch.float32, 1e-5)

    def test_unsupported_arguments_raise(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS)
        for bad in (dict(qv=q), dict(q_descale=torch.ones(8, 2)),
                    dict(k_descale=torch.ones(8, 2)), dict(v_descale=torch.ones(8, 2)),
                    dict(sm_margin=8)):
            with self.assertRaises(NotImplementedError, msg=str(bad)) as cm:
                fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, **bad)
            self.assertIn("not supported by fattn", str(cm.exception))

    def test_bad_arguments(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS)
        before = [t.clone() for t in (q, k, v, cu_q, cu_k)]
        i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
        for what, args in (
                ("q 4-D", (q[None], k, v, cu_q, cu_k, mq, mk)),
                ("k 2-D", (q, k[:, 0], v, cu_q, cu_k, mq, mk)),
                ("v's tokens", (q, k, v[1:], cu_q, cu_k, mq, mk)),
                ("v's heads", (q, k, v[:, :1], cu_q, cu_k, mq, mk)),
                ("k's head dim", (q, k[..., :16], v, cu_q, cu_k, mq, mk)),
                ("GQA ratio", (q[:, :3], k, v, cu_q, cu_k, mq, mk)),
                ("cu_seqlens_q int64", (q, k, v, cu_q.long(), cu_k, mq, mk)),
                ("cu_seqlens_k float", (q, k, v, cu_q, cu_k.float(), mq, mk)),
                ("cu_seqlens_q 2-D", (q, k, v, cu_q[None], cu_k, mq, mk)),
                ("cu_seqlens_q not contiguous", (q, k, v, torch.stack([cu_q, cu_q], 1)[:, 0], cu_k, mq, mk)),
                ("cu_seqlens of one entry", (q[:0], k[:0], v[:0], i32([0]), i32([0]), 0, 0)),
                ("mismatched lengths", (q, k, v, cu_q, cu_k[:-1], mq, mk)),
                ("cu_seqlens on another device", (q, k, v, cu_q.to("meta"), cu_k, mq, mk)),
                ("negative max_seqlen_q", (q, k, v, cu_q, cu_k, -1, mk)),
                ("max_seqlen_k >= 2**31", (q, k, v, cu_q, cu_k, mq, 2 ** 31)),
                # the library's checks of the entries (CPU engine, on the host): FattnInvalidArgumentError
                ("a sequence longer than max_seqlen_q", (q, k, v, cu_q, cu_k, mq - 1, mk)),
                ("a sequence longer than max_seqlen_k", (q, k, v, cu_q, cu_k, mq, mk - 1)),
                ("cu_seqlens_q[-1] != total_q", (q[:-1], k, v, cu_q, cu_k, mq, mk)),
                ("cu_seqlens_k[-1] != total_k", (q, k[1:], v[1:], cu_q, cu_k, mq, mk)),
                ("cu_seqlens_q decreasing", (q, k, v, torch.where(cu_q == 38, 300, cu_q), cu_k, 300, mk)),
                ("cu_seqlens_k[0] != 0", (q, k, v, cu_q, cu_k + 1, mq, mk))):
            with self.assertRaises(ValueError, msg=what) as cm:
                fattn.flash_attn_varlen_func(*args)
            self.assertIn("fattn", str(cm.exception), what)
            library = isinstance(cm.exception, fattn.FattnInvalidArgumentError)
            self.assertEqual(library, what.startswith(("a sequence", "cu_seqlens_q[", "cu_seqlens_k[",
                                                       "cu_seqlens_q dec")), (what, str(cm.exception)))
        for what, kw in (("seqused_k of 3", dict(seqused_k=i32([1, 2, 3]))),
                         ("seqused_k int64", dict(seqused_k=torch.ones(8, dtype=torch.int64)))):
            with self.assertRaises(ValueError, msg=what):
                fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, **kw)
        with self.assertRaises(fattn.FattnInvalidArgumentError):  # a negative entry: the library's check
            fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, seqused_k=-torch.ones(8, dtype=torch.int32))
        for what, args in (("cu_seqlens a list", (q, k, v, cu_q.tolist(), cu_k, mq, mk)),
                           ("max_seqlen_q a float", (q, k, v, cu_q, cu_k, float(mq), mk)),
                           ("max_seqlen_k a tensor", (q, k, v, cu_q, cu_k, mq, torch.tensor(mk))),
                           ("float64", (q.double(), k.double(), v.double(), cu_q, cu_k, mq, mk)),
                           ("NumPy", (q.numpy(), k, v, cu_q, cu_k, mq, mk))):
            with self.assertRaises(TypeError, msg=what):
                fattn.flash_attn_varlen_func(*args)
        for t, b in zip((q, k, v, cu_q, cu_k), before):  # nothing written
            self.assertTrue(torch.equal(t, b))
        # the messages say what is wrong
        with self.assertRaises(ValueError) as cm:
            fattn.flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k, mq, mk)
        self.assertIn("cu_seqlens_q must be a contiguous 1-D int32 tensor", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k[:-1], mq, mk)
        self.assertIn("cu_seqlens_q has 9 entries but cu_seqlens_k 8", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq - 1, mk)
        self.assertIn("length 130 > seqlen_q 129", str(cm.exception))

    def test_signature_is_fa3s(self):
        import inspect
        sig = inspect.signature(fattn.flash_attn_varlen_func)
        self.assertEqual(list(sig.parameters), FA3_VARLEN_ARGS)
        defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
        self.assertEqual((defaults["num_splits"], defaults["window_size"], defaults["softcap"]), (1, (-1, -1), 0.0))
        self.assertIn("flash_attn_varlen_func", fattn.__all__)

    def test_variants(self):
        # window_size, softcap and learnable_sink per sequence (bottom-right on its own lengths), forward
        # against the float64 reference sequence by sequence, backward (dsink over every sequence) as
        # Variants.test_backward_f32_against_float64
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=61)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(8))
        sink = torch.tensor([-30.0, 0.0, 1.5, 30.0])
        cq, ck = cu_q.tolist(), cu_k.tolist()

        def ref(a, b, c, s, causal, kw):
            outs = [variant_reference(a[cq[i]:cq[i + 1]][None], b[ck[i]:ck[i + 1]][None], c[ck[i]:ck[i + 1]][None],
                                      causal, dict(kw, learnable_sink=s if "learnable_sink" in kw else None))[0]
                    for i in range(len(cq) - 1)]
            return torch.cat(outs)

        for causal, kw in ((False, dict(window_size=(3, 0))), (True, dict(window_size=(0, 0))),
                           (False, dict(window_size=(-1, 5), softcap=2.0)), (True, dict(learnable_sink=sink)),
                           (False, dict(window_size=(20, 7), softcap=3.0, learnable_sink=sink))):
            def ours(a, b, c, s):
                return fattn.flash_attn_varlen_func(a, b, c, cu_q, cu_k, mq, mk, causal=causal,
                                                    **dict(kw, learnable_sink=s if "learnable_sink" in kw else None))

            want = sink_grads(lambda a, b, c, s: ref(a, b, c, s, causal, kw), q.double(), k.double(), v.double(),
                              sink.double(), dout.double())
            peer = sink_grads(lambda a, b, c, s: ref(a, b, c, s, causal, kw), q, k, v, sink, dout)
            got = sink_grads(ours, q, k, v, sink, dout)
            for name, g, p, w in zip(("o", "dq", "dk", "dv", "dsink"), got, peer, want):
                if name == "dsink" and "learnable_sink" not in kw:
                    self.assertIsNone(g)
                    continue
                err, peer_err = (g.double() - w).norm().item(), (p.double() - w).norm().item()
                floor = 1e-6 * max(w.norm().item(), 1.0) + 2e-7 * dout.norm().item()  # as Variants'
                self.assertLessEqual(err, 2 * peer_err + floor, (name, causal, kw))
            # the lse includes the sink; a sequence with no key gives lse = the sink (FA4's rule)
            o, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_attn_probs=True,
                                                  **kw)
            if "learnable_sink" in kw:
                rows = slice(cq[4], cq[5])  # (5, 0): five queries, no key
                self.assertTrue(torch.equal(lse[:, rows], sink.view(-1, 1).expand(-1, 5)))

    def test_variants_opcheck_and_compile(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs([(7, 9), (0, 3), (5, 2)], hq=2, hkv=1, d=16)
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        sink = torch.tensor([0.5, -1.0], requires_grad=True)
        args = (q, k, v, cu_q, cu_k, None, mq, mk, True, 0.3, False, 2, -1, 4.0, sink)
        for name, res in torch.library.opcheck(torch.ops.fattn.fwd_varlen.default, args).items():
            self.assertEqual(res, "SUCCESS", name)
        o, lse = torch.ops.fattn.fwd_varlen(*args)
        bargs = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), cu_q, cu_k, mq,
                 mk, True, 0.3, False, 2, -1, 4.0, sink.detach())
        for name, res in torch.library.opcheck(torch.ops.fattn.bwd_varlen.default, bargs).items():
            self.assertEqual(res, "SUCCESS", name)
        dout = torch.randn(o.shape, generator=torch.Generator().manual_seed(9))

        def f(a, b, c, s):
            return fattn.flash_attn_varlen_func(a * 1.5, b, c, cu_q, cu_k, mq, mk, causal=True, window_size=(2, 2),
                                                softcap=4.0, learnable_sink=s)

        want = sink_grads(f, q, k, v, sink, dout)
        torch._dynamo.reset()
        got = sink_grads(torch.compile(f, fullgraph=True, backend="aot_eager"), q, k, v, sink, dout)
        for name, a, w in zip(("o", "dq", "dk", "dv", "dsink"), got, want):
            self.assertTrue(torch.equal(a, w), name)

    def test_opcheck(self):
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs([(7, 9), (0, 3), (5, 2)], hq=2, hkv=1, d=16)
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        for args in ((q, k, v, cu_q, cu_k, None, mq, mk, True, 0.3, False),
                     (q.detach(), k.detach(), v.detach(), cu_q, cu_k, torch.tensor([3, 1, 2], dtype=torch.int32),
                      mq, mk, False, 0.3, False)):
            for name, res in torch.library.opcheck(torch.ops.fattn.fwd_varlen.default, args).items():
                self.assertEqual(res, "SUCCESS", name)
        o, lse = torch.ops.fattn.fwd_varlen(q, k, v, cu_q, cu_k, None, mq, mk, True, 0.3, False)
        bargs = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse, cu_q, cu_k, mq, mk, True,
                 0.3, False)
        used = torch.tensor([3, 1, 2], dtype=torch.int32)
        for args in (bargs, bargs + (-1, -1, 0.0, None, used, used)):  # and with seqused_q, seqused_k
            for name, res in torch.library.opcheck(torch.ops.fattn.bwd_varlen.default, args).items():
                self.assertEqual(res, "SUCCESS", name)

    def test_compile(self):
        # torch.compile(fullgraph=True) of a function calling it, forward and backward: aot_eager traces the
        # fake ops and the autograd formula; the same bits as eager (the same fattn calls)
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(VARLEN_SEQS, seed=60)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))

        def f(q, k, v, cu_q, cu_k):
            o, lse = fattn.flash_attn_varlen_func(q * 1.5, k, v, cu_q, cu_k, mq, mk, causal=True,
                                                  return_attn_probs=True)
            return o * 2, lse

        want = grads(lambda a, b, c: f(a, b, c, cu_q, cu_k)[0], q, k, v, dout)
        want_lse = f(q, k, v, cu_q, cu_k)[1]
        torch._dynamo.reset()
        cf = torch.compile(f, fullgraph=True, backend="aot_eager")
        got = grads(lambda a, b, c: cf(a, b, c, cu_q, cu_k)[0], q, k, v, dout)
        for name, a, w in zip(("o", "dq", "dk", "dv"), got, want):
            self.assertTrue(torch.equal(a, w), name)
        self.assertTrue(torch.equal(cf(q, k, v, cu_q, cu_k)[1], want_lse))


@unittest.skipUnless(HOPPER, "needs a Hopper GPU")
class VarlenCuda(unittest.TestCase):
    """flash_attn_varlen_func on CUDA tensors (the Hopper varlen forward, and its backward) in bf16 against
    varlen_reference in float64: out within 2e-2 (relative Frobenius, as class Cuda), lse within 1e-3 on the
    rows that see keys, -inf on the others; dq, dk, dv within 1e-2 (as Cuda.test_backward_matches_reference),
    with seqused_q / seqused_k too (Varlen.check_seqused_grads).  The forward and the backward enqueue
    their work without waiting for the GPU (torch's sync debug mode)."""

    SEQS = [(300, 300), (0, 0), (1, 77), (129, 64), (5, 0), (64, 200), (1000, 1000), (17, 17)]

    def test_seqused_q(self):
        Varlen.check_seqused_q(self, "cuda", torch.bfloat16, 2e-2, d=64)

    def test_forward_matches_reference(self):
        for d in (64, 128, 256):
            for causal in (False, True):
                msg = "d%d causal %s" % (d, causal)
                q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(self.SEQS, hq=8, hkv=2, d=d, dtype=torch.bfloat16,
                                                            seed=d)
                want, want_lse = varlen_reference(q.double(), k.double(), v.double(), cu_q, cu_k, causal)
                args = [t.cuda() for t in (q, k, v, cu_q, cu_k)]
                fattn.flash_attn_varlen_func(*args, mq, mk, causal=causal)  # the context and workspaces first
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    o, lse = fattn.flash_attn_varlen_func(*args, mq, mk, causal=causal, return_attn_probs=True)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                self.assertEqual((o.device.type, o.dtype, tuple(o.shape)), ("cuda", torch.bfloat16, tuple(q.shape)),
                                 msg)
                self.assertLess(rel(o.cpu(), want), 2e-2, msg)
                fin = torch.isfinite(want_lse)
                self.assertTrue(torch.equal(torch.isfinite(lse.cpu()), fin), msg)
                torch.testing.assert_close(lse.cpu()[fin].double(), want_lse[fin], rtol=1e-3, atol=1e-3,
                                           msg=lambda m: "%s: %s" % (msg, m))

    def test_seqused_k(self):
        # the CUDA engine's varlen kernels serve seqused_k (fattn.h): the values must be the reference's
        seqs = [(100, 300), (0, 4), (64, 64), (1, 90)]
        q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(seqs, hq=8, hkv=2, d=128, dtype=torch.bfloat16, seed=7)
        used = torch.tensor([200, 4, 0, 90], dtype=torch.int32)
        o = fattn.flash_attn_varlen_func(*(t.cuda() for t in (q, k, v, cu_q, cu_k)), mq, mk, causal=True,
                                         seqused_k=used.cuda())
        want, _ = varlen_reference(q.double(), k.double(), v.double(), cu_q, cu_k, True, seqused_k=used)
        self.assertLess(rel(o.cpu(), want), 2e-2)

    def test_seqused_grads(self):
        # the Hopper varlen backward with seqused_q and seqused_k (fattn_bwd_args): dq, dk, dv within 1e-2 of
        # the float64 reference on the used rows, exactly 0 on the others; deterministic mode too.  The
        # unused rows hold finite values (fattn.h: on CUDA those in a used row's block must be finite)
        def check(msg, g, p, w):
            self.assertLess(rel(g, w), 1e-2, msg)

        used_q = [299, 0, 1, 17, 5, 0, 1000, 1]  # SEQS: fewer, none, all, a tail, more than it has
        used_k = [1000, 0, 0, 63, 0, 100, 17, 17]
        for d in (64, 128, 256):
            Varlen.check_seqused_grads(self, "cuda", torch.bfloat16, [dict(hq=8, hkv=2, d=d)], used_q, used_k,
                                       self.SEQS, check, dets=(False, True))

    def test_backward_matches_reference(self):
        for d in (64, 128, 256):
            for causal in (False, True):
                msg = "d%d causal %s" % (d, causal)
                q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(self.SEQS, hq=8, hkv=2, d=d, dtype=torch.bfloat16,
                                                            seed=d + 1)
                g = torch.randn(q.shape, generator=torch.Generator().manual_seed(d)).to(torch.bfloat16)
                xs = [t.cuda().requires_grad_(True) for t in (q, k, v)]
                fattn.flash_attn_varlen_func(*xs, cu_q.cuda(), cu_k.cuda(), mq, mk, causal=causal).backward(g.cuda())
                ref = [t.double().requires_grad_(True) for t in (q, k, v)]
                varlen_reference(*ref, cu_q, cu_k, causal)[0].backward(g.double())
                for name, x, r in zip("qkv", xs, ref):
                    self.assertEqual((x.grad.device.type, x.grad.dtype), ("cuda", torch.bfloat16), msg)
                    self.assertLess(rel(x.grad.cpu(), r.grad), 1e-2, "%s d%s" % (msg, name))



@unittest.skipUnless(PORTABLE, "needs the portable CUDA engine (a GPU from sm_80 on other than Hopper, or "
                               "FATTN_CUDA_ENGINE=portable)")
class CudaPortable(unittest.TestCase):
    """CUDA tensors on the portable engine (issue 41): the engine fattn_ctx_engine names, the forward and
    its gradients through autograd (fattn_bwd) at every head dim it serves, fixed-length and varlen, against
    float64 (the tolerances of classes Cuda and VarlenCuda), and what it refuses, refused by name.  Head dims
    192 and 256 need 144-209 KB of shared memory per block: on GPUs with 99 KB (sm_86/89/120) the library
    answers UNSUPPORTED, which the test reports as a skip after the other cases."""

    def run_or_note(self, refused, what, fn):
        try:
            fn()
        except NotImplementedError as e:
            if "shared memory" not in str(e):
                raise
            refused.append("%s (%s)" % (what, str(e).splitlines()[0][:120]))

    def test_engine(self):
        e = fattn._core.context(fattn.BACKEND_CUDA, 0).engine
        self.assertRegex(e, r"^cuda portable sm_\d+")
        cap = torch.cuda.get_device_capability()
        self.assertIn("sm_%d%d" % cap, e)

    def test_forward_and_backward(self):
        refused = []
        for d, causal, (sq, sk) in ((64, False, (300, 300)), (128, True, (200, 333)), (128, False, (1, 77)),
                                    (192, True, (300, 300)), (256, True, (150, 100))):
            def case():
                msg = "d%d causal %s" % (d, causal)
                q, k, v = inputs(d=d, sq=sq, sk=sk, dtype=torch.bfloat16)
                g = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
                xs = [x.cuda().requires_grad_(True) for x in (q, k, v)]
                o = fattn.attention(*xs, causal=causal)
                ref = [x.double().requires_grad_(True) for x in (q, k, v)]
                ro = reference(*ref, causal=causal)
                self.assertEqual((o.device.type, o.dtype), ("cuda", torch.bfloat16), msg)
                self.assertLess(rel(o.detach().cpu(), ro.detach()), 2e-2, msg)
                o.backward(g.cuda())
                ro.backward(g.double())
                for name, x, r in zip("qkv", xs, ref):
                    self.assertEqual((x.grad.device.type, x.grad.dtype), ("cuda", torch.bfloat16), msg)
                    self.assertLess(rel(x.grad.cpu(), r.grad), 1e-2, "%s d%s" % (msg, name))
            self.run_or_note(refused, "d%d" % d, case)
        if refused:
            self.skipTest("refused for shared memory: " + "; ".join(refused))

    def test_varlen(self):
        seqs = [(300, 300), (0, 0), (1, 77), (129, 64), (64, 200), (17, 17)]
        for d in (64, 128):
            for causal in (False, True):
                msg = "d%d causal %s" % (d, causal)
                q, k, v, cu_q, cu_k, mq, mk = varlen_inputs(seqs, hq=8, hkv=2, d=d, dtype=torch.bfloat16, seed=d)
                g = torch.randn(q.shape, generator=torch.Generator().manual_seed(d)).to(torch.bfloat16)
                xs = [t.cuda().requires_grad_(True) for t in (q, k, v)]
                o = fattn.flash_attn_varlen_func(*xs, cu_q.cuda(), cu_k.cuda(), mq, mk, causal=causal)
                ref = [t.double().requires_grad_(True) for t in (q, k, v)]
                ro = varlen_reference(*ref, cu_q, cu_k, causal)[0]
                self.assertLess(rel(o.detach().cpu(), ro.detach()), 2e-2, msg)
                o.backward(g.cuda())
                ro.backward(g.double())
                for name, x, r in zip("qkv", xs, ref):
                    self.assertLess(rel(x.grad.cpu(), r.grad), 1e-2, "%s d%s" % (msg, name))

    def test_refusals_name_the_engine(self):
        # fattn.h: what the portable engine does not serve is UNSUPPORTED (NotImplementedError here),
        # its message naming the engine and the architecture; nothing falls back silently
        # (the variants' forward is served: gpu_portable_test_fwd_variants; their backward is not)
        q, k, v = (x.cuda() for x in inputs(d=64, sq=64, sk=64, dtype=torch.bfloat16))
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        for what, call in (("window backward",
                            lambda: fattn.attention(qg, kg, vg, window_size=(16, 0)).float().sum().backward()),
                           ("fp8", lambda: fattn.attention(q, k, v, fp8=True))):
            with self.assertRaises(NotImplementedError, msg=what) as cm:
                call()
            self.assertIn("portable CUDA engine (sm_", str(cm.exception), what)
        q80, k80, v80 = (x.cuda() for x in inputs(d=80, sq=64, sk=64, dtype=torch.bfloat16))
        with self.assertRaises(NotImplementedError) as cm:
            fattn.attention(q80, k80, v80)
        self.assertIn("head_dim 80", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
