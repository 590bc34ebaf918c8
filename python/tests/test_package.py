"""The package without NumPy or torch: finding the library, errors, contexts, exit.

Needs the library (FATTN_LIBRARY, the installed package, or build/libfattn.so)."""
import os
import subprocess
import sys
import unittest

import _path  # noqa: F401  (puts python/ first on sys.path)
import fattn
from fattn import _core

HERE = os.path.dirname(os.path.abspath(__file__))


def python(code, env=None):
    e = dict(os.environ)
    if not os.environ.get("FATTN_TEST_INSTALLED"):
        e["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..")] + [p for p in [e.get("PYTHONPATH")] if p])
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)


class Package(unittest.TestCase):
    def test_version(self):
        self.assertEqual(fattn.__version__, "%d.%d.%d" % fattn._capi.VERSION)
        self.assertEqual(fattn._lib.fattn_version_number(), 10000 * fattn._capi.VERSION[0]
                         + 100 * fattn._capi.VERSION[1] + fattn._capi.VERSION[2])

    def test_names_scripts_use(self):
        # bench/*.py and tests/gpu/test_vs_cudnn.py use these
        for n in ("Context", "attention", "flash_attn_func", "FattnError", "BACKEND_CPU", "BACKEND_CUDA",
                  "BACKEND_AUTO", "OPTION_DISABLE_OVERLAP", "OPTION_DISABLE_PINGPONG", "OPTION_DISABLE_PDL",
                  "OPTION_SOFTMAX_UNDER_PV", "OPTION_DISABLE_SPLIT", "F32", "F16", "BF16", "E4M3", "_lib"):
            self.assertTrue(hasattr(fattn, n), n)
        ctx = fattn.Context(fattn.BACKEND_CPU)
        for m in ("set_option", "set_stream", "set_threads", "fwd_args", "fwd_raw", "_check", "_h"):
            self.assertTrue(hasattr(ctx, m), m)

    def test_import_needs_neither_numpy_nor_torch(self):
        r = python("import sys, fattn; print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "[]")

    def test_exit_is_silent(self):
        # contexts freed at exit by a finalizer: no 'Exception ignored in __del__'
        r = python("import fattn\nc = fattn.Context(fattn.BACKEND_CPU)\nd = fattn._core.context(fattn.BACKEND_CPU)\n"
                   "fattn.Context(fattn.BACKEND_CPU).set_threads(1)\nimport sys; sys.modules['fattn'] = None\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")

    def test_library_override_is_not_a_fallback(self):
        r = python("import fattn", env={"FATTN_LIBRARY": "/nonexistent/libfattn.so"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/nonexistent/libfattn.so", r.stderr)
        self.assertIn("OSError", r.stderr)

    def test_library_search_order(self):
        saved = os.environ.pop("FATTN_LIBRARY", None)
        try:
            c = _core.library_candidates()
        finally:
            if saved is not None:
                os.environ["FATTN_LIBRARY"] = saved
        pkg = os.path.dirname(os.path.abspath(fattn.__file__))
        self.assertEqual(c[0], os.path.join(pkg, "libfattn.so"))
        self.assertEqual(c[-1], "libfattn.so")
        if os.path.isfile(os.path.join(pkg, "..", "..", "include", "fattn.h")):
            self.assertEqual(os.path.normpath(c[1]), os.path.normpath(os.path.join(pkg, "..", "..", "build",
                                                                                     "libfattn.so")))

    def test_errors_carry_the_library_message(self):
        ctx = fattn.Context(fattn.BACKEND_CPU)
        with self.assertRaises(fattn.FattnInvalidArgumentError) as cm:
            ctx.set_option(fattn.OPTION_DISABLE_SPLIT, 2)
        e = cm.exception
        self.assertIsInstance(e, ValueError)
        self.assertIsInstance(e, fattn.FattnError)
        self.assertIsInstance(e, RuntimeError)
        self.assertEqual(e.status, 1)
        self.assertIn("invalid argument", str(e))
        self.assertIn(fattn._lib.fattn_last_error(ctx._h).decode(), str(e))
        with self.assertRaises(fattn.FattnInvalidArgumentError):
            ctx.set_threads(-1)
        with self.assertRaises(fattn.FattnInvalidArgumentError):
            fattn.Context(7)
        self.assertTrue(issubclass(fattn.FattnUnsupportedError, NotImplementedError))

    def test_cuda_context_without_a_device(self):
        try:
            c = fattn.Context(fattn.BACKEND_CUDA, 0)
        except fattn.FattnUnsupportedError as e:
            self.assertIn(e.status, (2, 3))  # UNSUPPORTED (older than sm_80) or NO_DEVICE
            self.assertTrue(e.detail)
        else:
            c.close()
            self.skipTest("a usable CUDA device is present")

    def test_contexts(self):
        a = _core.context(fattn.BACKEND_CPU)
        self.assertIs(a, _core.context(fattn.BACKEND_CPU, 3))  # one CPU context, whatever the device
        self.assertEqual(a.backend, fattn.BACKEND_CPU)
        self.assertEqual(a.engine, "cpu")
        c = fattn.Context(fattn.BACKEND_AUTO)
        self.assertIn(c.backend, (fattn.BACKEND_CPU, fattn.BACKEND_CUDA))
        # fattn_ctx_engine: which engine and architecture (issue 41)
        if c.backend == fattn.BACKEND_CPU:
            self.assertEqual(c.engine, "cpu")
        else:
            self.assertRegex(c.engine, r"^cuda (hopper sm_90|portable sm_\d+)( \(FATTN_CUDA_ENGINE\))?$")
        c.close()
        c.close()  # harmless twice
        with self.assertRaises(ValueError):
            c.set_threads(1)

    def test_sizes_that_do_not_fit_int32_are_refused(self):
        # issue 43 item 3: ctypes stored 2**32 + 3 into an int32 field as 3
        p = fattn._capi.Problem()
        for field, value in (("seqlen_q", 2**32 + 3), ("head_dim", 2**32 + 1), ("batch", 2**31), ("heads_kv", -2**31 - 1)):
            with self.assertRaises(ValueError) as cm:
                setattr(p, field, value)
            self.assertIn(field, str(cm.exception))
            self.assertEqual(getattr(p, field), 0)  # nothing stored
        p.seqlen_q = 2**31 - 1
        self.assertEqual(p.seqlen_q, 2**31 - 1)
        with self.assertRaises(ValueError) as cm:
            fattn._capi.Tensor(0, 0, 2**63, 1, 1, None, 0)  # positional, int64 stride
        self.assertIn("stride_batch", str(cm.exception))
        a = fattn._capi.FwdArgs()
        with self.assertRaises(ValueError):
            a.p.seqlen_k = 2**32 + 3
        with self.assertRaises(ValueError):
            a.page_size = 2**32
        q = fattn._capi.QuantizeArgs()
        with self.assertRaises(ValueError):
            q.seed = -1
        ctx = fattn.Context(fattn.BACKEND_CPU)
        with self.assertRaises(ValueError) as cm:
            ctx.set_threads(2**32 + 2)
        self.assertIn("threads", str(cm.exception))
        with self.assertRaises(ValueError):
            ctx.set_option(fattn.OPTION_DISABLE_SPLIT, 2**32 + 1)
        with self.assertRaises(ValueError):
            fattn.Context(fattn.BACKEND_CPU, 2**32)
        ctx.close()

    def test_rejects_other_types(self):
        with self.assertRaises(TypeError):
            fattn.attention([[1.0]], [[1.0]], [[1.0]])


if __name__ == "__main__":
    unittest.main()
