"""fattn.attention on NumPy arrays (CPU engine) against a float64 NumPy reference,
fattn_bwd with the variants (d(learnable_sink) included) through the package's ctypes
layer against analytic float64 gradients, and every kind of bad argument.  Needs NumPy and the library, not torch."""
import os
import unittest

import _path  # noqa: F401
import numpy as np

import fattn


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, sink=None):
    """float64 softmax attention, FlashAttention's bottom-right causal mask and window, softcap and
    FA4's sinks (fattn.h); (o, lse)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=2)
    v = np.repeat(v, hq // hkv, axis=2)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    hide = np.zeros((sq, sk), bool)
    if causal:
        hide |= j > i + sk - sq
    if window[1] >= 0:
        hide |= j > i + sk - sq + window[1]
    if window[0] >= 0:
        hide |= j < i + sk - sq - window[0]
    s = np.where(hide, -np.inf, s)
    if sink is not None:  # one more column, no value row
        s = np.concatenate([s, np.broadcast_to(np.asarray(sink, np.float64)[None, :, None, None], (b, hq, sq, 1))], -1)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(den > 0, e / den, 0.0)
        lse = np.where(den[..., 0] > 0, np.log(den[..., 0]) + m[..., 0], -np.inf)
    return np.einsum("bhqk,bkhd->bqhd", p[..., :sk], v), lse


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def inputs(b=2, sq=37, sk=45, hq=4, hkv=2, d=16, dv=None, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    dv = d if dv is None else dv
    return (r.standard_normal((b, sq, hq, d)).astype(dtype), r.standard_normal((b, sk, hkv, d)).astype(dtype),
            r.standard_normal((b, sk, hkv, dv)).astype(dtype))


def reference_grads(q, k, v, dout, causal=False, scale=None, window=(-1, -1), softcap=0.0, sink=None):
    """The analytic float64 gradients (dq, dk, dv, dsink) of reference()'s output for dout: dS =
    P * (dP - D) with D = rowsum(dout * o), times 1 - tanh^2 under the softcap; dsink[h] =
    -sum_i exp(sink_h - lse_i) D_i (fattn.h)."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    o, lse = reference(q, k, v, causal, scale, window, softcap, sink)
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    t = np.tanh(s / softcap) if softcap else None
    if softcap:
        s = softcap * t
    with np.errstate(invalid="ignore"):
        p = np.nan_to_num(np.exp(s - lse[..., None]))  # rows without keys or sink: lse -inf
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    hide = np.zeros((sq, sk), bool)
    if causal:
        hide |= j > i + sk - sq
    if window[1] >= 0:
        hide |= j > i + sk - sq + window[1]
    if window[0] >= 0:
        hide |= j < i + sk - sq - window[0]
    p = np.where(hide, 0.0, p)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, vr)
    dd = np.einsum("bqhd,bqhd->bhq", dout, o)
    ds = p * (dp - dd[..., None])
    if softcap:
        ds = ds * (1.0 - t * t)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    fold = lambda x: x.reshape(b, sk, hkv, g, -1).sum(3)  # noqa: E731  GQA: sum over each group's heads
    dsink = None
    if sink is not None:
        with np.errstate(invalid="ignore"):
            w = np.nan_to_num(np.exp(np.asarray(sink, np.float64)[None, :, None] - lse))
        dsink = -(w * dd).sum((0, 2))
    return dq, fold(dk), fold(dv), dsink


def raw_backward(q, k, v, dout, causal=False, scale=None, window=None, softcap=0.0, sink=None):
    """fattn_bwd through the package's ctypes layer on NumPy arrays (the NumPy path has no
    autograd): (dq, dk, dv, dsink) of fattn_fwd's own o and lse, with the same variants."""
    from fattn import _core
    ctx = _core.context(_core.BACKEND_CPU)
    o, lse = fattn.attention(q, k, v, causal, scale, return_lse=True, window_size=window or (-1, -1),
                             softcap=softcap, learnable_sink=sink)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    sink32 = None if sink is None else np.ascontiguousarray(sink, np.float32)
    dsink = None if sink is None else np.empty(q.shape[2], np.float32)
    ds = [_core.describe(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (dout, "dout"), (dq, "dq"),
                                           (dk, "dk"), (dv, "dv"))]
    dims = _core.check_shapes(q.shape, k.shape, v.shape)
    var = _core.Variants(window, softcap, None if sink32 is None else sink32.ctypes.data)
    _core.run_bwd(ctx, dims, *ds, lse.ctypes.data, causal, _core.resolve_scale(scale, q.shape[3]), False,
                  variants=var, dsink=None if dsink is None else dsink.ctypes.data)
    return dq, dk, dv, dsink


class Forward(unittest.TestCase):
    def test_matches_reference(self):
        # f32: the CPU engine accumulates in f32 (error ~1e-7 relative); f16: inputs and
        # output rounded to 11 bits (~5e-4 relative each)
        for dtype, tol in ((np.float32, 1e-5), (np.float16, 3e-3)):
            for causal in (False, True):
                for shape in (dict(), dict(hq=6, hkv=1), dict(sq=50, sk=20), dict(d=24, dv=40), dict(b=1, sq=1, sk=1)):
                    q, k, v = inputs(dtype=dtype, **shape)
                    o, lse = fattn.attention(q, k, v, causal=causal, return_lse=True)
                    ro, rl = reference(q, k, v, causal)
                    self.assertEqual(o.dtype, dtype)
                    self.assertEqual(o.shape, ro.shape)
                    self.assertEqual(lse.dtype, np.float32)
                    self.assertLess(rel(o, ro), tol, (dtype, causal, shape))
                    fin = np.isfinite(rl)
                    np.testing.assert_array_equal(np.isfinite(lse), fin)
                    np.testing.assert_allclose(lse[fin], rl[fin], rtol=1e-4, atol=1e-4)

    def test_rows_that_see_no_key(self):
        q, k, v = inputs(sq=10, sk=4)
        o, lse = fattn.attention(q, k, v, causal=True, return_lse=True)
        self.assertTrue((o[:, :6] == 0).all())
        self.assertTrue(np.isneginf(lse[:, :, :6]).all())

    def test_softmax_scale(self):
        q, k, v = inputs()
        o = fattn.attention(q, k, v, softmax_scale=0.3)
        self.assertLess(rel(o, reference(q, k, v, scale=0.3)[0]), 1e-5)
        for bad in (0.0, -1.0, float("inf"), float("nan")):
            with self.assertRaises(ValueError):
                fattn.attention(q, k, v, softmax_scale=bad)

    def test_layouts(self):
        q, k, v = inputs()
        ro = reference(q, k, v)[0]
        bhsd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v)]
        self.assertLess(rel(fattn.attention(*bhsd), ro), 1e-5)
        flipped = [np.ascontiguousarray(x[:, ::-1])[:, ::-1] for x in (q, k, v)]  # negative strides: copied
        self.assertLess(rel(fattn.attention(*flipped), ro), 1e-5)
        wide = np.zeros(q.shape[:3] + (2 * q.shape[3],), np.float32)[..., ::2]  # head dim not contiguous
        wide[...] = q
        self.assertLess(rel(fattn.attention(wide, k, v), ro), 1e-5)
        kb = np.broadcast_to(k[:, :, :1], k.shape)  # stride 0 along heads
        vb = np.broadcast_to(v[:, :, :1], v.shape)
        self.assertLess(rel(fattn.attention(q, kb, vb), reference(q, kb, vb)[0]), 1e-5)
        packed = np.random.default_rng(1).standard_normal((2, 37, 3, 4, 16)).astype(np.float32)
        qp, kp, vp = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]  # one qkv buffer
        self.assertLess(rel(fattn.attention(qp, kp, vp), reference(qp, kp, vp)[0]), 1e-5)

    def test_out(self):
        q, k, v = inputs()
        out = np.empty((2, 37, 4, 16), np.float32)
        r = fattn.attention(q, k, v, out=out)
        self.assertIs(r, out)
        self.assertLess(rel(out, reference(q, k, v)[0]), 1e-5)
        for bad in (np.empty((2, 37, 4, 16), np.float16), np.empty((2, 37, 4, 8), np.float32),
                    np.empty((2, 37, 4, 32), np.float32)[..., ::2]):
            with self.assertRaises(ValueError):
                fattn.attention(q, k, v, out=bad)
        ro = np.empty((2, 37, 4, 16), np.float32)
        ro.flags.writeable = False
        with self.assertRaises(ValueError):
            fattn.attention(q, k, v, out=ro)
        overlap = np.lib.stride_tricks.as_strided(np.empty(2 * 37 * 16, np.float32), (2, 37, 4, 16),
                                                  (37 * 16 * 4, 16 * 4, 4, 4))  # heads on top of each other
        with self.assertRaises(ValueError):
            fattn.attention(q, k, v, out=overlap)

    def test_fp8(self):
        # e4m3 keeps 3 mantissa bits: each V entry carries ~2^-4 / sqrt(3) = 3.6% relative
        # rounding error, and O = P V averages it no better than it averages V itself, so
        # O's relative error is ~4-5% on N(0, 1) inputs (measured 4.1-5.0e-2 over seeds,
        # head dims 64 and 24, both masks); garbage would be ~1
        for d in (64, 24):  # fp8=True: block scales of 128 rows, no rotation
            q, k, v = inputs(d=d, sq=200, sk=200)
            for causal in (False, True):
                o = fattn.attention(q, k, v, causal=causal, fp8=True)
                self.assertEqual(o.dtype, np.float32)
                self.assertLess(rel(o, reference(q, k, v, causal)[0]), 7e-2, (d, causal))

    def test_fp8_options_bitwise(self):
        # fattn_fwd_fp8 is the bits of fattn_quantize on q, k, v into packed e4m3 followed
        # by fattn_fwd on them (fattn.h): done here by hand through _capi
        from fattn import _capi, _core
        ctx = _core.context(_core.BACKEND_CPU)

        def by_hand(q, k, v, causal, cfg):
            tensor = cfg.granularity == "tensor"
            blocks = (128, 128, 128) if tensor else (cfg.block_q, cfg.block_k, cfg.block_v)
            keep, coded = [], []
            for x, blk, rot in ((q, blocks[0], cfg.rotate), (k, blocks[1], cfg.rotate), (v, blocks[2], False)):
                b, s, h, d = x.shape
                codes = np.empty((b, s, h, d), np.uint8)
                scales = np.empty((b, h, -(-s // blk)), np.float32)
                keep += [codes, scales]
                qa = _capi.QuantizeArgs()
                setattr(qa, "in", _core.tensor_struct(_core.describe(x, "x")))
                qa.out = _capi.Tensor(codes.ctypes.data, _core.E4M3, 0, 0, 0, scales.ctypes.data, blk)
                qa.batch, qa.seqlen, qa.heads, qa.head_dim = b, s, h, d
                qa.granularity = _core.QUANT_TENSOR if tensor else _core.QUANT_BLOCK
                qa.block_rows, qa.rotate, qa.seed = blk, int(rot), cfg.seed
                ctx.quantize_raw(qa)
                coded.append(_capi.Tensor(codes.ctypes.data, _core.E4M3, 0, 0, 0, scales.ctypes.data, blk))
            dims = _core.check_shapes(q.shape, k.shape, v.shape)
            o = np.empty(dims.o_shape, q.dtype)
            a = _capi.FwdArgs()
            a.p = _core.problem(dims, causal, 1.0 / np.sqrt(dims.d))
            a.q, a.k, a.v = coded
            a.o = _core.tensor_struct(_core.describe(o, "o"))
            ctx.fwd_raw(a)
            return o

        q, k, v = inputs(sq=150, sk=300, hq=6, hkv=2, d=32)
        want = fattn.attention(q, k, v)
        for cfg in (fattn.FP8(), fattn.FP8(rotate=True, seed=11), fattn.FP8(block_k=1),
                    fattn.FP8(block_q=7, block_k=64, block_v=300), fattn.FP8(granularity="tensor", rotate=True)):
            for causal in (False, True):
                o = fattn.attention(q, k, v, causal=causal, fp8=cfg)
                self.assertTrue(np.array_equal(o.view(np.int32), by_hand(q, k, v, causal, cfg).view(np.int32)),
                                (cfg, causal))
            self.assertLess(rel(fattn.attention(q, k, v, fp8=cfg), want.astype(np.float64)), 7e-2, cfg)
        self.assertTrue(np.array_equal(fattn.attention(q, k, v, fp8=True), fattn.attention(q, k, v, fp8=fattn.FP8())))
        with self.assertRaises(TypeError):
            fattn.attention(q, k, v, fp8="block")
        with self.assertRaises(fattn.FattnUnsupportedError):  # the library's refusal
            fattn.attention(*inputs(d=24), fp8=fattn.FP8(rotate=True))

    def test_empty(self):
        q, k, v = inputs(sk=0)
        o, lse = fattn.attention(q, k, v, return_lse=True)
        self.assertTrue((o == 0).all() and np.isneginf(lse).all())
        q, k, v = inputs(b=0)
        self.assertEqual(fattn.attention(q, k, v).shape, (0, 37, 4, 16))

    def test_bfloat16_if_ml_dtypes(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes not installed")
        q, k, v = (x.astype(ml_dtypes.bfloat16) for x in inputs())
        o = fattn.attention(q, k, v)
        self.assertEqual(o.dtype, q.dtype)
        self.assertLess(rel(o.astype(np.float32), reference(q, k, v)[0]), 2e-2)


class Variants(unittest.TestCase):
    def test_matches_reference(self):
        sink = np.array([-30.0, 0.0, 1.5, 30.0], np.float32)
        for kw in (dict(window_size=(3, 0)), dict(window_size=(0, 0)), dict(window_size=(-1, 2)),
                   dict(window_size=(1000, 1000)), dict(softcap=5.0), dict(learnable_sink=sink),
                   dict(softcap=2.0, softmax_scale=1.0),  # large logits: |s| up to ~15 against cap 2
                   dict(window_size=(4, -1), softcap=2.0, learnable_sink=sink)):
            for causal in (False, True):
                for shape in (dict(), dict(sq=50, sk=20), dict(sq=1, sk=17)):
                    q, k, v = inputs(**shape)
                    o, lse = fattn.attention(q, k, v, causal=causal, return_lse=True, **kw)
                    ro, rl = reference(q, k, v, causal, kw.get("softmax_scale"), window=kw.get("window_size", (-1, -1)),
                                       softcap=kw.get("softcap", 0.0), sink=kw.get("learnable_sink"))
                    self.assertLess(rel(o, ro), 1e-5, (kw, causal, shape))
                    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(rl))
                    fin = np.isfinite(rl)
                    np.testing.assert_allclose(lse[fin], rl[fin], atol=1e-4)

    def test_no_keys(self):
        # sk = 0: o = 0 and lse = the sink (fattn.h, FA4's rule), -inf without one
        sink = np.array([-30.0, 0.0, 1.5, 30.0], np.float32)
        q, k, v = inputs(sk=0)
        o, lse = fattn.attention(q, k, v, return_lse=True, learnable_sink=sink)
        self.assertFalse(o.any())
        np.testing.assert_array_equal(lse, np.broadcast_to(sink[None, :, None], lse.shape))

    def test_backward_against_analytic(self):
        # fattn_bwd with the variants (dq, dk, dv and dsink, the C API's d(learnable_sink)) on NumPy
        # arrays, against the analytic float64 gradients: f32 rounding (measured <= 2e-6 relative)
        sink = np.array([-30.0, 0.0, 1.5, 30.0], np.float32)
        r = np.random.default_rng(3)
        for causal, kw in ((False, dict(window=(3, 0))), (True, dict(window=(0, 0))), (False, dict(softcap=2.0)),
                           (True, dict(sink=sink)), (False, dict(window=(4, -1), softcap=2.0, sink=sink)),
                           (True, dict(window=(1000, 1000), softcap=5.0, sink=sink, scale=1.0))):
            for shape in (dict(), dict(sq=50, sk=20)):
                q, k, v = inputs(**shape)
                dout = r.standard_normal(q.shape[:3] + (v.shape[3],)).astype(np.float32)
                got = raw_backward(q, k, v, dout, causal, kw.get("scale"), kw.get("window"), kw.get("softcap", 0.0),
                                   kw.get("sink"))
                want = reference_grads(q, k, v, dout, causal, kw.get("scale"), kw.get("window", (-1, -1)),
                                       kw.get("softcap", 0.0), kw.get("sink"))
                for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
                    if w is None:
                        continue
                    err = np.linalg.norm(g.astype(np.float64) - w)
                    self.assertLessEqual(err, 1e-5 * max(np.linalg.norm(w), 1.0), (name, causal, kw, shape))

    def test_bad_values(self):
        q, k, v = inputs()
        for kw in (dict(window_size=(-2, 0)), dict(window_size=(1,)), dict(window_size=(1.5, 0)),
                   dict(softcap=-1.0), dict(softcap=float("nan")),
                   dict(learnable_sink=np.zeros(3, np.float32))):
            with self.assertRaises(ValueError, msg=kw):
                fattn.attention(q, k, v, **kw)
        with self.assertRaises(TypeError):
            fattn.attention(q, k, v, learnable_sink=[0.0] * 4)


class BadArguments(unittest.TestCase):
    def test_dtype(self):
        q, k, v = inputs()
        with self.assertRaises(TypeError) as cm:  # was a bare KeyError
            fattn.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
        self.assertIn("float64", str(cm.exception))
        with self.assertRaises(TypeError):  # was read with q's dtype, past k's end
            fattn.attention(q, k.astype(np.float16), v)
        with self.assertRaises(TypeError):
            fattn.attention(q.astype(np.int32), k, v)
        with self.assertRaises(TypeError):
            fattn.attention(q, k.tolist(), v)

    def test_non_native_byte_order(self):
        # issue 43 item 4: '>f4' and '>f2' were read as native words
        other = ">" if np.little_endian else "<"
        for dtype, tol in ((np.float32, 1e-5), (np.float16, 3e-3)):
            q, k, v = inputs(dtype=dtype)
            ro = reference(q, k, v, causal=True)[0]
            swapped = [x.astype(x.dtype.newbyteorder(other)) for x in (q, k, v)]
            self.assertFalse(swapped[0].dtype.isnative)
            o = fattn.attention(*swapped, causal=True)
            self.assertTrue(o.dtype.isnative)
            self.assertEqual(o.dtype, np.dtype(dtype))
            self.assertLess(rel(o, ro), tol)
            o2 = fattn.attention(q, swapped[1], v, causal=True)  # mixed orders
            self.assertLess(rel(o2, ro), tol)
            with self.assertRaises(ValueError) as cm:  # the library cannot write swapped words
                fattn.attention(q, k, v, out=np.empty(q.shape, dtype=np.dtype(dtype).newbyteorder(other)))
            self.assertIn("byte order", str(cm.exception))
        q, k, v = inputs()
        ctx = fattn.Context(fattn.BACKEND_CPU)
        with self.assertRaises(TypeError) as cm:  # the raw path refuses them
            ctx.fwd_args(q.astype(">f4" if np.little_endian else "<f4"), k, v, np.empty_like(q))
        self.assertIn("byte order", str(cm.exception))

    def test_shapes(self):
        q, k, v = inputs()
        for args in ((q[0], k, v), (q, k[:1], v), (q, k, v[:, :5]), (q, k[..., :8], v),
                     (q[:, :, :3], k, v), (q, k[:, :, :0], v[:, :, :0])):
            with self.assertRaises(ValueError):
                fattn.attention(*args)

    def test_raw_args_take_each_dtype(self):
        # Context.fwd_args used q's dtype for every tensor: k f16 was read as f32
        q, k, v = inputs()
        ctx = fattn.Context(fattn.BACKEND_CPU)
        o = np.empty_like(q)
        with self.assertRaises(fattn.FattnInvalidArgumentError) as cm:
            ctx.fwd_raw(ctx.fwd_args(q, k.astype(np.float16), v, o))
        self.assertIn("k.dtype f16 differs from q.dtype f32", str(cm.exception))
        ctx.fwd_raw(ctx.fwd_args(q, k, v, o))
        self.assertLess(rel(o, reference(q, k, v)[0]), 1e-5)

    def test_library_limits_raise_not_implemented(self):
        q, k, v = inputs(d=513, sq=2, sk=2)
        with self.assertRaises(NotImplementedError) as cm:
            fattn.attention(q, k, v)
        self.assertIsInstance(cm.exception, fattn.FattnUnsupportedError)
        self.assertIn("head_dim 513 is not supported by the CPU engine", str(cm.exception))

    def test_cpu_context_only(self):
        try:
            c = fattn.Context(fattn.BACKEND_CUDA, 0)
        except fattn.FattnError:
            self.skipTest("no CUDA context here")
        with self.assertRaises(ValueError):
            fattn.attention(*inputs(), ctx=c)


@unittest.skipUnless(hasattr(os, "fork"), "no fork")
class Fork(unittest.TestCase):
    def test_child_computes(self):
        q, k, v = inputs()
        o = fattn.attention(q, k, v)  # the parent's CPU context and its threads exist
        pid = os.fork()
        if pid == 0:  # the child gets a context of its own
            try:
                ok = np.array_equal(fattn.attention(q, k, v), o)
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(status, 0)


if __name__ == "__main__":
    unittest.main()
