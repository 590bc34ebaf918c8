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


if __name__ == "__main__":
    if "--cc" in sys.argv:
        i = sys.argv.index("--cc")
        CC = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    unittest.main()
