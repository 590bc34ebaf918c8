"""fattn.merge (fattn_merge): attention over two or three key blocks, merged, against
attention over all the keys (fattn.attention, CPU engine), causal through each block's
window; parts with no visible key (LSE -inf), dtypes, packed varlen parts, bad arguments;
NumPy arrays, and torch tensors (the custom op: opcheck, torch.compile(fullgraph=True);
CUDA on a Hopper GPU).  Needs NumPy and the library; the torch cases skip without torch."""
import unittest

import _path  # noqa: F401
import numpy as np

import fattn

HAVE_TORCH = _path.have("torch")
HAVE_BF16 = _path.have("ml_dtypes")
if HAVE_TORCH:
    import torch
    HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
else:
    HOPPER = False


def blocks(sk, n):
    """n key ranges [lo, hi) covering 0..sk (uneven)."""
    cuts = [0] + [max(1, sk * (i + 1) // n - i) for i in range(n - 1)] + [sk]
    return list(zip(cuts[:-1], cuts[1:]))


def block_window(causal, sk, hi):
    """fattn.attention's window_size over keys [lo, hi) that gives the full call's
    bottom-right causal mask: query i sees key j iff j <= i + sk - sq."""
    return (-1, sk - hi) if causal else (-1, -1)


def parts_of(q, k, v, causal, n):
    outs, lses = [], []
    for lo, hi in blocks(k.shape[1], n):
        o, l = fattn.attention(q, k[:, lo:hi], v[:, lo:hi], return_lse=True,
                               window_size=block_window(causal, k.shape[1], hi))
        outs.append(o)
        lses.append(l)
    return outs, lses


class NumpyMerge(unittest.TestCase):
    def qkv(self, b=2, sq=24, sk=40, hq=4, hkv=2, d=32, dtype=np.float32, seed=0):
        r = np.random.default_rng(seed)
        return tuple(r.standard_normal(s).astype(dtype) for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))

    def test_blocks_equal_all_keys(self):
        for causal in (False, True):
            for n in (2, 3):
                with self.subTest(causal=causal, n=n):
                    q, k, v = self.qkv(sq=40)
                    o, l = fattn.attention(q, k, v, causal=causal, return_lse=True)
                    outs, lses = parts_of(q, k, v, causal, n)
                    if causal:  # the first rows see no key of the last block
                        self.assertTrue(np.isneginf(lses[-1][:, :, 0]).all())
                    m, ml = fattn.merge(outs, lses)
                    self.assertEqual((m.dtype, m.shape, ml.dtype, ml.shape), (o.dtype, o.shape, ml.dtype, l.shape))
                    np.testing.assert_allclose(m, o, atol=2e-6, rtol=0)
                    np.testing.assert_allclose(ml, l, atol=2e-6, rtol=0)
                    m2, ml2 = fattn.merge(np.stack(outs), np.stack(lses))  # stacked [n, ...]
                    np.testing.assert_array_equal(m2, m)
                    np.testing.assert_array_equal(ml2, ml)

    @unittest.skipUnless(HAVE_BF16, "NumPy's bfloat16 needs ml_dtypes")
    def test_bf16(self):
        import ml_dtypes
        q, k, v = self.qkv(dtype=ml_dtypes.bfloat16)
        o, l = fattn.attention(q, k, v, causal=True, return_lse=True)
        outs, lses = parts_of(q, k, v, True, 3)
        m, ml = fattn.merge(outs, lses)
        self.assertEqual(m.dtype, q.dtype)
        np.testing.assert_allclose(m.astype(np.float32), o.astype(np.float32), atol=2e-2, rtol=0)
        np.testing.assert_allclose(ml, l, atol=1e-5, rtol=0)
        m32, _ = fattn.merge(outs, lses, out_dtype=np.float32)
        self.assertEqual(m32.dtype, np.float32)
        mixed, _ = fattn.merge([outs[0].astype(np.float32)] + outs[1:], lses)  # parts of two dtypes: float32
        self.assertEqual(mixed.dtype, np.float32)
        np.testing.assert_array_equal(mixed, m32)

    def test_no_keys(self):
        r = np.random.default_rng(1)
        o = r.standard_normal((2, 1, 5, 3, 8)).astype(np.float32)
        lse = r.standard_normal((2, 1, 3, 5)).astype(np.float32)
        lse[1, 0, 0, :] = -np.inf  # part 1 has no key for head 0
        o[1, 0, :, 0, :] = np.nan  # ... and its out there is not read
        lse[:, 0, 2, 4] = -np.inf  # row (head 2, token 4): no key in any part
        m, ml = fattn.merge(o, lse)
        np.testing.assert_array_equal(m[0, :, 0], o[0, 0, :, 0])
        np.testing.assert_array_equal(ml[0, 0], lse[0, 0, 0])
        np.testing.assert_array_equal(m[0, 4, 2], 0)
        self.assertEqual(ml[0, 2, 4], -np.inf)
        self.assertFalse(np.isnan(m).any())
        w = np.exp(lse[:, 0, 1, 2] - np.logaddexp.reduce(lse[:, 0, 1, 2]))
        np.testing.assert_allclose(m[0, 2, 1], (w[:, None] * o[:, 0, 2, 1]).sum(0), atol=1e-6, rtol=0)

    def test_packed_and_strided(self):
        r = np.random.default_rng(2)
        o = r.standard_normal((3, 7, 2, 16)).astype(np.float32)  # [n, total, h, d]
        lse = r.standard_normal((3, 2, 7)).astype(np.float32)  # [n, h, total]
        m, ml = fattn.merge(o, lse, out_dtype="float16")
        self.assertEqual((m.dtype, m.shape, ml.shape), (np.float16, (7, 2, 16), (2, 7)))
        w = np.exp(lse - np.logaddexp.reduce(lse, axis=0))  # [n, h, total]
        ref = np.einsum("nht,nthd->thd", w, o)
        np.testing.assert_allclose(m.astype(np.float32), ref, atol=2e-3, rtol=0)
        np.testing.assert_allclose(ml, np.logaddexp.reduce(lse, axis=0), atol=1e-5, rtol=0)
        # head dim not contiguous: read through a copy
        ot = np.ascontiguousarray(o.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
        m2, _ = fattn.merge(list(ot), list(lse), out_dtype=np.float16)
        np.testing.assert_array_equal(m2, m)

    def test_bad_arguments(self):
        o = np.zeros((2, 1, 4, 2, 8), np.float32)
        lse = np.zeros((2, 1, 2, 4), np.float32)
        with self.assertRaises(ValueError):
            fattn.merge(o, lse[:, :, :, :3])  # lse not [b, h, s]
        with self.assertRaises(ValueError):
            fattn.merge([o[0], o[1, :, :3]], list(lse))  # parts of different shapes
        with self.assertRaises(ValueError):
            fattn.merge(list(o), list(lse)[:1])  # 2 outs, 1 lse
        with self.assertRaises(ValueError):
            fattn.merge([], [])
        with self.assertRaises(ValueError):
            fattn.merge([o[0]] * 1025, [lse[0]] * 1025)  # FATTN_MERGE_MAX_PARTS
        with self.assertRaises(TypeError):
            fattn.merge(o, lse.astype(np.float64))  # fattn_merge reads float32 LSEs
        with self.assertRaises(TypeError):
            fattn.merge(o.astype(np.float64), lse)
        with self.assertRaises(TypeError):
            fattn.merge(o, lse, out_dtype=np.int32)
        with self.assertRaises(TypeError):
            fattn.merge("o", lse)
        m, ml = fattn.merge([o[0][:, :0]], [lse[0][:, :, :0]])  # no rows
        self.assertEqual((m.shape, ml.shape), ((1, 0, 2, 8), (1, 2, 0)))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchMerge(unittest.TestCase):
    def qkv(self, dtype=None, device="cpu", b=2, sq=40, sk=40, hq=4, hkv=2, d=32):
        # (no torch default here: the class body runs without torch too, before its skip)
        dtype = torch.float32 if dtype is None else dtype
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(s, generator=g).to(dtype=dtype, device=device)
                     for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))

    def check_blocks(self, dtype, device, atol, d=32):
        for causal in (False, True):
            for n in (2, 3):
                with self.subTest(dtype=dtype, causal=causal, n=n):
                    q, k, v = self.qkv(dtype, device, d=d)
                    o, l = fattn.attention(q, k, v, causal=causal, return_lse=True)
                    outs, lses = parts_of(q, k, v, causal, n)
                    m, ml = fattn.merge(outs, lses)
                    self.assertEqual((m.dtype, m.device, ml.dtype), (dtype, q.device, torch.float32))
                    torch.testing.assert_close(m.float(), o.float(), atol=atol, rtol=0)
                    torch.testing.assert_close(ml, l, atol=1e-5, rtol=0)
                    m2, ml2 = fattn.merge(torch.stack(outs), torch.stack(lses))
                    self.assertTrue(torch.equal(m2, m) and torch.equal(ml2, ml))

    def test_blocks_equal_all_keys(self):
        self.check_blocks(torch.float32, "cpu", 2e-6)
        self.check_blocks(torch.bfloat16, "cpu", 2e-2)

    @unittest.skipUnless(HOPPER, "needs a Hopper GPU")
    def test_cuda(self):
        self.check_blocks(torch.bfloat16, "cuda", 2e-2, d=64)  # a head dim the Hopper kernels serve
        o = torch.randn(3, 2, 16, 4, 64, device="cuda")
        lse = torch.randn(3, 2, 4, 16, device="cuda")
        m, ml = fattn.merge(o, lse)
        mc, mlc = fattn.merge(o.cpu(), lse.cpu())
        torch.testing.assert_close(m.cpu(), mc, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(ml.cpu(), mlc, atol=1e-6, rtol=1e-6)

    def test_no_keys_and_dtypes(self):
        g = torch.Generator().manual_seed(3)
        o = torch.randn(2, 1, 5, 3, 8, generator=g)
        lse = torch.randn(2, 1, 3, 5, generator=g)
        lse[1, 0, 0] = -torch.inf
        o[1, 0, :, 0] = torch.nan  # not read: its lse is -inf
        lse[:, 0, 2, 4] = -torch.inf
        m, ml = fattn.merge(o, lse)
        self.assertTrue(torch.equal(m[0, :, 0], o[0, 0, :, 0]))
        self.assertTrue(torch.equal(m[0, 4, 2], torch.zeros(8)))
        self.assertEqual(ml[0, 2, 4].item(), -float("inf"))
        self.assertFalse(m.isnan().any())
        ref, _ = fattn.merge(o.numpy(), lse.numpy())  # the same library call from NumPy
        self.assertTrue(torch.equal(m, torch.from_numpy(ref)))
        for od, want in ((None, torch.float32), (torch.bfloat16, torch.bfloat16), ("float16", torch.float16)):
            self.assertEqual(fattn.merge(o, lse, out_dtype=od)[0].dtype, want)
        mixed = fattn.merge([o[0].bfloat16(), o[1].half()], list(lse))[0]
        self.assertEqual(mixed.dtype, torch.float32)

    def test_bad_arguments(self):
        o = torch.zeros(2, 1, 4, 2, 8)
        lse = torch.zeros(2, 1, 2, 4)
        with self.assertRaises(TypeError):
            fattn.merge(o, lse.double())
        with self.assertRaises(TypeError):
            fattn.merge([o[0], o[1].numpy()], list(lse))
        with self.assertRaises(ValueError):
            fattn.merge(o, lse.transpose(2, 3))
        with self.assertRaises(NotImplementedError):
            fattn.merge(o.requires_grad_(), lse)
        with torch.no_grad():
            fattn.merge(o, lse)

    def test_opcheck(self):
        g = torch.Generator().manual_seed(4)
        o = [torch.randn(2, 6, 3, 16, generator=g), torch.randn(2, 6, 3, 16, generator=g).bfloat16()]
        lse = [torch.randn(2, 3, 6, generator=g) for _ in range(2)]
        torch.library.opcheck(torch.ops.fattn.merge.default, (o, lse, torch.float16),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))

    def test_compile(self):
        q, k, v = self.qkv()
        outs, lses = parts_of(q, k, v, True, 3)

        def f(a, b, c, la, lb, lc):
            m, ml = fattn.merge([a, b, c], [la, lb, lc])
            return m * 2, ml + 1

        want = f(*outs, *lses)
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(*outs, *lses)
        self.assertTrue(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))


if __name__ == "__main__":
    unittest.main()
