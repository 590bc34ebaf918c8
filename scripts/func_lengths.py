#!/usr/bin/env python3
"""List the functions of src/ longer than the house limit (issue 42: 200 lines).

    python3 scripts/func_lengths.py [--max 200] [--all] [--root DIR]

Scans every .c, .h, .cc, .cpp, .hpp, .cu and .cuh file below DIR/src (DIR:
the repository, by default the one this script is in) with a brace-matching
pass: comments, string and character literals and preprocessor lines are
blanked first, then a `{` at file, namespace, extern "C" or class scope whose
declaration ends in `)` (qualifiers, attributes, a trailing return type or a
constructor's initialiser list may follow) opens a function body; a lambda
counts as part of the function around it.  A function's length is its
declaration's first line (a template line included; a macro invocation
standing alone on the line before is not) to its closing brace, inclusive:
on src/ this agrees with universal-ctags' extents, which start at the name.
Exit status: 0 when none is over --max; 1 when some are (one line each,
longest first); 2 when the scanner fails its own fixture or a file cannot be
scanned reliably (unbalanced braces, e.g. #if branches that open a brace
each): the check fails loudly rather than miss a function.  --all lists
every function.  ctest func_lengths runs it.
"""
import argparse
import os
import re
import sys

EXTS = (".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".cuh")
ATTR = re.compile(r"__attribute__\s*\(\(.*?\)\)|__declspec\s*\([^)]*\)|alignas\s*\([^)]*\)|__align__\s*\([^)]*\)|\[\[.*?\]\]")
FUNC_END = re.compile(r"\)\s*((const|volatile|noexcept|override|final|mutable|try)\b\s*|&&?\s*|noexcept\s*\([^)]*\)\s*)*"
                      r"(->\s*[^;{}()]+(\([^)]*\))?\s*)?$")
CTOR_INIT = re.compile(r"\)\s*(noexcept\s*)?:\s*[A-Za-z_:][^;{}]*$")
CLASS = re.compile(r"(^|[\s>])(struct|class|union|enum)(\s+class|\s+struct)?\b[^()=]*$")


class ScanError(Exception):
    pass


def blank(text):
    """text with comments, literals and preprocessor lines turned to spaces
    (newlines kept, so offsets and line numbers stay)."""
    out = list(text)
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c in " \t":
            i += 1
            continue
        if at_line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a block comment inside a directive
                    k = text.find("*/", j + 2)
                    j = n if k < 0 else k + 2
                    continue
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ScanError("unterminated comment")
            j += 2
        elif c == '"' or c == "'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                i += 1  # a C++14 digit separator: 1'000
                continue
            m = re.compile(r'R"([^()\\ ]{0,16})\(').match(text, i - 1) if c == '"' and i > 0 and text[i - 1] == "R" else None
            if m:
                j = text.find(")" + m.group(1) + '"', i)
                if j < 0:
                    raise ScanError("unterminated raw string")
                j += len(m.group(1)) + 2
            else:
                j = i + 1
                while j < n and text[j] != c:
                    if text[j] == "\\":
                        j += 1
                    elif text[j] == "\n":
                        raise ScanError("newline in a literal")
                    j += 1
                j += 1
            for k in range(i + 1, j - 1):  # keep the quotes: extern "C" stays recognisable
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def drop_templates(h):
    """h without its `template <...>` parameter lists (their defaults hold `=`)."""
    out, i = [], 0
    for m in re.finditer(r"\btemplate\s*<", h):
        if m.start() < i:
            continue
        depth, paren, j = 1, 0, m.end()
        while j < len(h) and depth:
            c = h[j]
            paren += (c == "(") - (c == ")")
            if paren == 0:
                depth += (c == "<") - (c == ">")
            j += 1
        out.append(h[i:m.start()])
        i = j
    out.append(h[i:])
    return " ".join("".join(out).split())


def classify(header):
    """'func', 'scope' (namespace, extern "C", class: functions inside count)
    or 'other' (an initialiser, a lambda, anything else: skipped whole)."""
    h = drop_templates(ATTR.sub(" ", header))
    if re.search(r"(^|\s)namespace(\s+[\w:]+)?(\s+inline)?$", h) or re.search(r'(^|\s)extern\s+"\s*"$', h):
        return "scope"
    if CLASS.search(h):
        return "scope"
    if "(" in h and (FUNC_END.search(h) or CTOR_INIT.search(h)):
        depth, top_eq = 0, False
        for k, ch in enumerate(h):  # `x = f(y) {`: an initialiser, not a body
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch == "=" and depth == 0 and h[k + 1:k + 2] != "=" and h[k - 1:k] not in ("=", "!", "<", ">") \
                    and "operator" not in h[max(0, k - 12):k]:
                top_eq = True
        if not top_eq:
            return "func"
    return "other"


ATTR_WORDS = {"__attribute__", "__launch_bounds__", "__cluster_dims__", "__maxnreg__", "__declspec", "alignas",
              "__align__", "decltype", "noexcept", "throw", "requires"}


def decl_offset(header):
    """Where the declaration starts in header: after the last line that ends
    a macro invocation standing alone (`FOO(x)` with no `;`, e.g. a macro
    that defines functions), not an attribute such as __launch_bounds__(n)."""
    off, pos, depth = 0, 0, 0
    lines = header.split("\n")
    for k, line in enumerate(lines):
        for ch in line:
            depth += (ch == "(") - (ch == ")")
        pos += len(line) + 1
        body = line.rstrip()
        if depth or not body.endswith(")") or "(" not in "\n".join(lines[k + 1:]):
            continue
        d, j = 0, len(body) - 1
        while j >= 0:  # the ( that matches the line's last )
            d += (body[j] == ")") - (body[j] == "(")
            if d == 0:
                break
            j -= 1
        m = re.search(r"(\w+)\s*$", body[:max(j, 0)])
        if j > 0 and m and m.group(1) not in ATTR_WORDS:
            off = pos
    return off


def func_name(header):
    h = " ".join(ATTR.sub(" ", header).split())
    m = CTOR_INIT.search(h)
    if m:  # a constructor: the name before its initialiser list
        h = h[:m.start() + 1]
    depth, k = 0, h.rfind(")")
    while k >= 0:  # back to the ( that matches the declaration's last )
        if h[k] == ")":
            depth += 1
        elif h[k] == "(":
            depth -= 1
            if depth == 0:
                break
        k -= 1
    m = re.search(r"(operator\s*\S+|[~\w:]+(\s*<[^<>]*>)?(\([^()]*\))?)\s*$", h[:k])
    return m.group(1) if m else h[:40]


def scan(text):
    """[(name, first line, last line)] of the functions in text."""
    b = blank(text)
    line_of = []
    ln = 1
    for ch in b:
        line_of.append(ln)
        if ch == "\n":
            ln += 1
    funcs = []
    stack = []  # kinds of the open braces
    start = 0  # where the current declaration's text begins
    i, n = 0, len(b)
    while i < n:
        ch = b[i]
        if ch == ";":
            start = i + 1
        elif ch == "{":
            header = b[start:i]
            if all(k == "scope" for k in stack):
                cut = decl_offset(header)
                start, header = start + cut, header[cut:]
                kind = classify(header)
            else:
                kind = "inner"
            stack.append(kind)
            if kind == "func":
                first = start + len(header) - len(header.lstrip())
                depth, j = 1, i + 1
                while j < n and depth:
                    if b[j] == "{":
                        depth += 1
                    elif b[j] == "}":
                        depth -= 1
                    j += 1
                if depth:
                    raise ScanError(f"line {line_of[i]}: the brace of {func_name(header)} never closes")
                funcs.append((func_name(header), line_of[first], line_of[j - 1]))
                stack.pop()
                i = j
                start = j
                continue
            start = i + 1
        elif ch == "}":
            if not stack:
                raise ScanError(f"line {line_of[i]}: a closing brace with none open")
            stack.pop()
            start = i + 1
        elif ch == ":" and stack and stack[-1] == "scope" and re.search(r"(public|private|protected)\s*$", b[start:i]):
            start = i + 1  # an access label
        i += 1
    if stack:
        raise ScanError(f"{len(stack)} brace(s) never close")
    return funcs


FIXTURE = r"""#define M(x) do { x; } while (0)
extern "C" {
static const int t[] = {1, 2};
FOO(a)
template <int N = 2, bool B = (N > 1)>
__global__ void __launch_bounds__(128, 1)
    kern(int a, const char *s = "{") {
    auto l = [&](int x) { return x + '}'; };
}
}
struct S {
    int f() const { return 1; }
    S(int a) : v(a) {}
    int v;
};
namespace n {
int g(void)
{
    /* { */ return 0; // }
}
}
"""
FIXTURE_WANT = [("kern", 5, 9), ("f", 12, 12), ("S", 13, 13), ("g", 17, 20)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=200, help="the longest a function may be, in lines (200)")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--all", action="store_true", help="list every function with its length")
    args = ap.parse_args()
    got = scan(FIXTURE)
    if got != FIXTURE_WANT:  # the scanner itself, on the forms src/ uses
        print(f"func_lengths: the scanner is broken: {got} != {FIXTURE_WANT}", file=sys.stderr)
        return 2
    src = os.path.join(args.root, "src")
    rows, errors = [], []
    for d, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(EXTS):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, args.root)
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for name, a, z in scan(fh.read()):
                        rows.append((z - a + 1, rel, a, z, name))
            except ScanError as e:
                errors.append(f"{rel}: {e}")
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for e in errors:
        print(f"func_lengths: cannot scan {e}", file=sys.stderr)
    long_ = [r for r in rows if r[0] > args.max]
    for length, rel, a, z, name in rows if args.all else long_:
        print(f"{length:5d}  {rel}:{a}-{z}  {name}")
    if errors:
        return 2
    if long_:
        print(f"func_lengths: {len(long_)} function(s) over {args.max} lines (issue 42): split them", file=sys.stderr)
        return 1
    print(f"func_lengths: {len(rows)} functions in src/, none over {args.max} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
