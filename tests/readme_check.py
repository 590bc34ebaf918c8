#!/usr/bin/env python3
"""Keeps README.md true (ctest readme, readme_python):

    readme_check.py transcript FATTN [--ctest-dir DIR] [--example EXAMPLE_C]   `make run`'s transcript against `FATTN run
        --backend cpu`: the same lines, exact except the measured numbers of the time, throughput,
        error and memory lines; with --ctest-dir, `make test`'s "out of N" against that build's
        `ctest -N` (only for the build the README names: CPU only, Python 3, a C++ compiler);
        with --example, c-example too
    readme_check.py c-example EXAMPLE_C                  the C block's lines are EXAMPLE_C's, in order
    readme_check.py python                               runs the first Python block (the CPU one);
        exit 77 (skipped) without NumPy. FATTN_LIBRARY names the library to load."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURED = ("time", "throughput", "rel. Frobenius err", "max abs err", "peak memory")


def blocks(lang):
    """The README's fenced blocks of one info string ('' for plain fences)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    return [m.group(1) for m in re.finditer(r"^```%s\n(.*?)^```$" % re.escape(lang), text, re.S | re.M)]


def after_command(cmd):
    for b in blocks(""):
        lines = b.splitlines()
        if lines and lines[0].startswith("$ " + cmd):
            return lines[2:] if len(lines) > 1 and lines[1] == "..." else lines[1:]
    sys.exit("README.md has no transcript of `%s`" % cmd)


def check_transcript(fattn, ctest_dir):
    want = after_command("make run")
    got = subprocess.run([fattn, "run", "--backend", "cpu"], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    bad = []
    if len(want) != len(got):
        bad.append("%d lines in README.md, %d printed" % (len(want), len(got)))
    for w, g in zip(want, got):
        label = w.strip()
        if any(label.startswith(m + " ") for m in MEASURED):  # the label and the words around the numbers
            same = re.sub(r"[0-9][0-9.e+-]*", "N", w) == re.sub(r"[0-9][0-9.e+-]*", "N", g)
        else:
            same = w == g
        if not same:
            bad.append("README.md: %r\n    printed: %r" % (w, g))
    if ctest_dir:
        tail = after_command("make test")[-1]
        readme_n = int(re.search(r"out of (\d+)$", tail).group(1))
        listed = subprocess.run(["ctest", "-N"], cwd=ctest_dir, check=True, capture_output=True,
                                text=True).stdout
        n = int(re.search(r"Total Tests: (\d+)", listed).group(1))
        if n != readme_n:
            bad.append("README.md's `make test` says %d tests, this build has %d" % (readme_n, n))
    for b in bad:
        print(b)
    print("transcript: %s" % ("differs" if bad else "matches"))
    return 1 if bad else 0


def check_c_example(path):
    src = [l.rstrip() for l in open(path)]
    i = 0
    for line in blocks("c")[0].splitlines():
        if not line.strip():
            continue
        while i < len(src) and src[i] != line.rstrip():
            i += 1
        if i == len(src):
            print("README.md's C line is not in %s (in this order): %r" % (path, line))
            return 1
        i += 1
    print("c-example: every line is the file's")
    return 0


def run_python():
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: NumPy is not installed")
        return 77
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-c", blocks("python")[0]], env=env).returncode


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "transcript":
        d = sys.argv[sys.argv.index("--ctest-dir") + 1] if "--ctest-dir" in sys.argv else None
        rc = check_transcript(sys.argv[2], d)
        if "--example" in sys.argv:
            rc |= check_c_example(sys.argv[sys.argv.index("--example") + 1])
        sys.exit(rc)
    if mode == "c-example":
        sys.exit(check_c_example(sys.argv[2]))
    if mode == "python":
        sys.exit(run_python())
    sys.exit(__doc__)
