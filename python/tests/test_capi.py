"""The ctypes mirror (python/fattn/_capi.py) against include/fattn.h, so that neither drifts:

- every typedef enum of the header: its enumerators, in order, with their values;
- every typedef struct: its fields in order, each with the ctypes type its C type maps to;
- every FATTN_API function: its return and parameter types;
- the version macros against _capi.VERSION and python/pyproject.toml;
- with a C compiler (argument --cc, or $CC, or cc): offsetof/sizeof of every field and
  struct, and every enumerator's value, as the compiler sees them, against ctypes.

Needs neither torch, NumPy nor the library: _capi.py is loaded by path on its own.
Run: python3 python/tests/test_capi.py [--cc PATH]  (or through pytest / ctest's python_capi).
"""
import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HEADER = os.path.join(ROOT, "include", "fattn.h")
CAPI = os.path.join(ROOT, "python", "fattn", "_capi.py")
PYPROJECT = os.path.join(ROOT, "python", "pyproject.toml")
CC = None  # set by --cc


def load_capi():
    spec = importlib.util.spec_from_file_location("fattn_capi_under_test", CAPI)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def parse_header(path=HEADER):
    """{'enums': {name: [(enumerator, value)]}, 'structs': {name: [(field, ctype)]},
    'functions': {name: (ret ctype, [param ctypes])}, 'version': (maj, min, patch)}.
    C types come back normalised: 'const char *' -> 'char*', 'fattn_ctx **' -> 'fattn_ctx**'."""
    with open(path) as f:
        raw = f.read()
    version = tuple(int(re.search(r"#define FATTN_VERSION_%s (\d+)" % p, raw).group(1))
                    for p in ("MAJOR", "MINOR", "PATCH"))
    src = strip_comments(raw)
    src = re.sub(r"^\s*#.*?(?<!\\)$", " ", src, flags=re.M | re.S)  # preprocessor lines

    enums = {}
    for body, name in re.findall(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", src, re.S):
        items, nxt = [], 0
        for e in (x.strip() for x in body.split(",")):
            if not e:
                continue
            m = re.fullmatch(r"(\w+)\s*(?:=\s*(-?\d+))?", e)
            assert m, "cannot parse enumerator %r of %s" % (e, name)
            val = int(m.group(2)) if m.group(2) is not None else nxt
            items.append((m.group(1), val))
            nxt = val + 1
        enums[name] = items

    def norm_type(t):
        t = re.sub(r"\bconst\b", " ", t)
        t = re.sub(r"\s+", " ", t).strip()
        return re.sub(r"\s*\*", "*", t)

    structs = {}
    for body, name in re.findall(r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", src, re.S):
        fields = []
        for decl in (d.strip() for d in body.split(";")):
            if not decl:
                continue
            m = re.fullmatch(r"((?:const\s+)?[A-Za-z_]\w*)\s*(.+)", decl, re.S)
            base, rest = m.group(1), m.group(2)
            for dcl in rest.split(","):
                dm = re.fullmatch(r"\s*(\**)\s*(\w+)\s*", dcl)
                assert dm, "cannot parse field %r of %s" % (dcl, name)
                fields.append((dm.group(2), norm_type(base + dm.group(1))))
        structs[name] = fields

    functions = {}
    for ret_name, params in re.findall(r"FATTN_API\s+([^;(]+?)\s*\(([^)]*)\)\s*;", src, re.S):
        m = re.fullmatch(r"(.*?)(\w+)", ret_name.strip(), re.S)
        ret, name = norm_type(m.group(1)), m.group(2)
        ps = []
        if params.strip() != "void":
            for p in params.split(","):
                pm = re.fullmatch(r"\s*(.*?[\s*])(\w+)\s*", p, re.S)  # every parameter of the header is named
                assert pm, "cannot parse parameter %r of %s" % (p, name)
                ps.append(norm_type(pm.group(1)))
        functions[name] = (ret, ps)
    return {"enums": enums, "structs": structs, "functions": functions, "version": version}


_SCALARS = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
            "uint8_t": ctypes.c_uint8, "float": ctypes.c_float, "int": ctypes.c_int, "size_t": ctypes.c_size_t}


def allowed_ctypes(ctype, capi, h):
    """The ctypes types a C type may be mirrored by."""
    structs = {s._c_name_: s for s in capi.STRUCTS}
    if ctype == "void":
        return [None]
    if ctype in _SCALARS:
        return [_SCALARS[ctype]]
    if ctype in h["enums"]:
        return [capi.c_enum]
    if ctype in structs:
        return [structs[ctype]]
    if ctype == "char*":
        return [ctypes.c_char_p]
    if ctype == "fattn_ctx*":  # opaque handle
        return [ctypes.c_void_p]
    if ctype.endswith("*"):
        inner = ctype[:-1]
        alts = [ctypes.c_void_p]
        if inner != "void":
            alts += [ctypes.POINTER(t) for t in allowed_ctypes(inner, capi, h) if t is not None]
        return alts
    raise AssertionError("no ctypes mapping for C type %r" % ctype)


class HeaderMirror(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.h = parse_header()
        cls.capi = load_capi()

    def test_parser_sees_the_header(self):
        # guards the parser itself: a header reshaped beyond it must fail here, not pass empty
        self.assertGreaterEqual(len(self.h["enums"]), 5)
        self.assertGreaterEqual(len(self.h["structs"]), 5)
        self.assertGreaterEqual(len(self.h["functions"]), 19)
        self.assertIn(("q", "fattn_tensor"), self.h["structs"]["fattn_fwd_args"])

    def test_enums(self):
        self.assertEqual(set(self.capi.ENUMS), set(self.h["enums"]), "typedef enums")
        for name, items in self.h["enums"].items():
            self.assertEqual(list(self.capi.ENUMS[name].items()), items, "enum %s" % name)

    def test_structs(self):
        mine = {s._c_name_: s for s in self.capi.STRUCTS}
        self.assertEqual(set(mine), set(self.h["structs"]), "typedef structs")
        for name, fields in self.h["structs"].items():
            got = [f[0] for f in mine[name]._fields_]
            self.assertEqual(got, [f[0] for f in fields], "fields of %s, in order" % name)
            for (fname, ctype), (_, pytype) in zip(fields, mine[name]._fields_):
                self.assertIn(pytype, allowed_ctypes(ctype, self.capi, self.h), "%s.%s (%s)" % (name, fname, ctype))

    def test_functions(self):
        self.assertEqual(set(self.capi.PROTOTYPES), set(self.h["functions"]), "FATTN_API functions")
        for name, (ret, params) in self.h["functions"].items():
            pret, pparams = self.capi.PROTOTYPES[name]
            self.assertIn(pret, allowed_ctypes(ret, self.capi, self.h), "%s returns %s" % (name, ret))
            self.assertEqual(len(pparams), len(params), "%s's parameters" % name)
            for i, (c, p) in enumerate(zip(params, pparams)):
                self.assertIn(p, allowed_ctypes(c, self.capi, self.h), "%s parameter %d (%s)" % (name, i, c))

    def test_version(self):
        self.assertEqual(tuple(self.capi.VERSION), self.h["version"])
        with open(PYPROJECT) as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        self.assertEqual(m.group(1), "%d.%d.%d" % self.h["version"], "python/pyproject.toml's version")


def _compiler():
    for c in (CC, os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


class CompiledLayout(unittest.TestCase):
    """What the C compiler says about offsets, sizes and values, against ctypes."""

    @classmethod
    def setUpClass(cls):
        cls.cc = _compiler()
        if cls.cc is None:
            raise unittest.SkipTest("no C compiler")
        cls.h, cls.capi = parse_header(), load_capi()
        lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "fattn.h"', "int main(void) {"]
        for s, fields in cls.h["structs"].items():
            lines.append('printf("%s %%zu\\n", sizeof(%s));' % (s, s))
            for f, _ in fields:
                lines.append('printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                             % (s, f, s, f, s, f))
        for e, items in cls.h["enums"].items():
            lines.append('printf("%s %%zu\\n", sizeof(%s));' % (e, e))
            for n, _ in items:
                lines.append('printf("%s %%lld\\n", (long long)%s);' % (n, n))
        lines.append("return 0; }")
        d = tempfile.mkdtemp(prefix="fattn_capi_")
        try:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            subprocess.run([cls.cc, "-std=c99", "-I", os.path.join(ROOT, "include"), src, "-o", exe], check=True)
            out = subprocess.run([exe], check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
        finally:
            shutil.rmtree(d, ignore_errors=True)
        cls.c = {}
        for line in out.splitlines():
            k, *v = line.split()
            cls.c[k] = tuple(int(x) for x in v)

    def test_struct_layout(self):
        for s in self.capi.STRUCTS:
            name = s._c_name_
            self.assertEqual(ctypes.sizeof(s), self.c[name][0], "sizeof(%s)" % name)
            for f, t in s._fields_:
                off, size = self.c["%s.%s" % (name, f)]
                self.assertEqual(getattr(s, f).offset, off, "offsetof(%s, %s)" % (name, f))
                self.assertEqual(ctypes.sizeof(t), size, "sizeof %s.%s" % (name, f))

    def test_enum_values(self):
        for e, items in self.capi.ENUMS.items():
            self.assertEqual(ctypes.sizeof(self.capi.c_enum), self.c[e][0], "sizeof(%s)" % e)
            for n, v in items.items():
                self.assertEqual(self.c[n][0], v, n)


# ---------------------------------------------------------------------------
# FP8 through ctypes alone (no NumPy, no torch: what CI runs)
# ---------------------------------------------------------------------------

def _library():
    """FATTN_LIBRARY, else the build this test runs in (ctest's cwd is <build>/tests),
    else build/libfattn.so of the source tree; None when none exists."""
    env = os.environ.get("FATTN_LIBRARY")
    if env:
        return env
    for c in (os.path.join(os.getcwd(), "..", "libfattn.so"), os.path.join(ROOT, "build", "libfattn.so")):
        if os.path.exists(c):
            return os.path.abspath(c)
    return None


def fp8_child(path):
    """Run in a subprocess (a sanitizer build's library aborts a plain python3 when
    loaded): fattn_fwd_fp8 against fattn_quantize + fattn_fwd on e4m3 by hand, bitwise,
    and against fattn_fwd on the f32 inputs.  Prints LOADED once the library is bound."""
    import random
    capi = load_capi()
    lib = capi.bind(ctypes.CDLL(path))
    print("LOADED", flush=True)
    E = capi.ENUMS
    F32, E4M3 = E["fattn_dtype"]["FATTN_DTYPE_F32"], E["fattn_dtype"]["FATTN_DTYPE_E4M3"]
    BLOCK, TENSOR = E["fattn_quant_granularity"]["FATTN_QUANT_BLOCK"], E["fattn_quant_granularity"]["FATTN_QUANT_TENSOR"]
    ctx = ctypes.c_void_p()
    assert lib.fattn_ctx_create(ctypes.byref(ctx), E["fattn_backend"]["FATTN_BACKEND_CPU"], 0) == 0

    def check(st):
        assert st == 0, lib.fattn_last_error(ctx).decode()

    rng = random.Random(5)
    b, sq, sk, hq, hkv, d = 2, 70, 150, 4, 2, 32  # GQA, more keys than queries

    def arr(n):
        return (ctypes.c_float * n)(*[rng.gauss(0.0, 1.0) for _ in range(n)])

    q, k, v = arr(b * sq * hq * d), arr(b * sk * hkv * d), arr(b * sk * hkv * d)

    def fwd_args(causal, o, qt, kt, vt):
        a = capi.FwdArgs()
        a.p = capi.Problem(b, sq, sk, hq, hkv, d, d, 0.0, causal, None, None)
        a.q, a.k, a.v = qt, kt, vt
        a.o = capi.Tensor(ctypes.addressof(o), F32, 0, 0, 0, None, 0)
        return a

    def plain(x):
        return capi.Tensor(ctypes.addressof(x), F32, 0, 0, 0, None, 0)

    def rel(x, y):
        num = sum((p - r) ** 2 for p, r in zip(x, y))
        return (num / max(sum(r * r for r in y), 1e-30)) ** 0.5

    n_o = b * sq * hq * d
    for causal in (0, 1):
        want = (ctypes.c_float * n_o)()
        check(lib.fattn_fwd(ctx, ctypes.byref(fwd_args(causal, want, plain(q), plain(k), plain(v)))))
        for gran, bq, bk, bv, rot, seed in ((BLOCK, 0, 0, 0, 0, 0), (BLOCK, 128, 1, 128, 1, 7),
                                            (BLOCK, 16, 64, 50, 0, 0), (TENSOR, 0, 0, 0, 1, 2 ** 64 - 1)):
            opt = capi.Fp8Options(gran, bq, bk, bv, rot, seed)
            got = (ctypes.c_float * n_o)()
            check(lib.fattn_fwd_fp8(ctx, ctypes.byref(fwd_args(causal, got, plain(q), plain(k), plain(v))),
                                    ctypes.byref(opt)))
            # by hand: fattn_quantize x 3 into packed e4m3 (per tensor: blocks of 128), fattn_fwd
            coded, keep = [], []
            for x, s, h, blk, r in ((q, sq, hq, bq, rot), (k, sk, hkv, bk, rot), (v, sk, hkv, bv, 0)):
                blk = 128 if gran == TENSOR or blk == 0 else blk
                codes = (ctypes.c_uint8 * (b * s * h * d))()
                scales = (ctypes.c_float * (b * h * (-(-s // blk))))()
                keep += [codes, scales]
                qa = capi.QuantizeArgs()
                setattr(qa, "in", plain(x))
                qa.out = capi.Tensor(ctypes.addressof(codes), E4M3, 0, 0, 0, ctypes.addressof(scales), blk)
                qa.batch, qa.seqlen, qa.heads, qa.head_dim = b, s, h, d
                qa.granularity, qa.block_rows, qa.rotate, qa.seed = gran, blk, r, seed
                check(lib.fattn_quantize(ctx, ctypes.byref(qa)))
                coded.append(capi.Tensor(ctypes.addressof(codes), E4M3, 0, 0, 0, ctypes.addressof(scales), blk))
            hand = (ctypes.c_float * n_o)()
            check(lib.fattn_fwd(ctx, ctypes.byref(fwd_args(causal, hand, *coded))))
            what = (causal, gran, bq, bk, bv, rot, seed)
            assert bytes(got) == bytes(hand), "fattn_fwd_fp8 is not quantize + fwd bit for bit: %s" % (what,)
            e = rel(got, want)
            # e4m3: ~4-5e-2 relative on N(0, 1) inputs (python/tests/test_numpy.py says why)
            assert 1e-3 < e < 7e-2, "error %g against fattn_fwd in f32: %s" % (e, what)
    bad = capi.Fp8Options(7, 0, 0, 0, 0, 0)
    got = (ctypes.c_float * n_o)()
    st = lib.fattn_fwd_fp8(ctx, ctypes.byref(fwd_args(0, got, plain(q), plain(k), plain(v))), ctypes.byref(bad))
    assert st == E["fattn_status"]["FATTN_ERROR_INVALID_ARGUMENT"], st
    assert b"granularity" in lib.fattn_last_error(ctx)
    lib.fattn_ctx_free(ctx)
    print("FP8 OK")


class Fp8ThroughCtypes(unittest.TestCase):
    def test_fwd_fp8_is_quantize_then_fwd(self):
        path = _library()
        if path is None:
            self.skipTest("no libfattn.so found (set FATTN_LIBRARY)")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--fp8-child", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
        if "LOADED" not in r.stdout:
            self.skipTest("%s does not load in python3 (a sanitizer build?): %s" % (path, r.stderr[-500:]))
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-3000:])
        self.assertIn("FP8 OK", r.stdout)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fp8-child"]:
        fp8_child(sys.argv[2])
        sys.exit(0)
    if "--cc" in sys.argv:
        i = sys.argv.index("--cc")
        CC = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    unittest.main()
